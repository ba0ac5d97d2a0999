# The build's identity for --version (lfm2-rank, h5pack): the project version, the commit, and the
# versions of CUDA, NCCL, MPI, HDF5 and the compiler this build was configured with, in the
# generated header <lfm2/build_info.h> (build/generated/). The commit is read at every build (the
# target lfm2_commit rewrites build_commit.h only when it changed), so a new commit needs no new
# configure; without git (a source tarball, a container build without .git) it is the cache
# variable LFM2_COMMIT, else "unknown". Targets call lfm2_use_build_info(target).
set(LFM2_COMMIT "" CACHE STRING "the commit --version names when the sources have no git history")

set(LFM2_CUDA_VERSION_TEXT "none (CPU-only build)")
set(LFM2_NCCL_VERSION_TEXT "none (CPU-only build)")
if(LFM2_HAVE_CUDA)
  set(LFM2_CUDA_VERSION_TEXT "${CUDAToolkit_VERSION}")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  string(REGEX REPLACE ".*NCCL_MAJOR +([0-9]+).*NCCL_MINOR +([0-9]+).*NCCL_PATCH +([0-9]+).*" "\\1.\\2.\\3"
         LFM2_NCCL_VERSION_TEXT "${_nccl}")
endif()

# Open MPI's own version from its header, beside the MPI standard version.
set(LFM2_MPI_VERSION_TEXT "MPI ${MPI_C_VERSION}")
foreach(_dir ${MPI_C_INCLUDE_DIRS})
  if(EXISTS "${_dir}/mpi.h")
    file(STRINGS "${_dir}/mpi.h" _ompi REGEX "^#define OMPI_(MAJOR|MINOR|RELEASE)_VERSION +[0-9]+")
    if(_ompi)
      string(REGEX REPLACE ".*MAJOR_VERSION +([0-9]+).*MINOR_VERSION +([0-9]+).*RELEASE_VERSION +([0-9]+).*"
             "Open MPI \\1.\\2.\\3" _ompi_text "${_ompi}")
      set(LFM2_MPI_VERSION_TEXT "${_ompi_text} (MPI ${MPI_C_VERSION})")
    endif()
    break()
  endif()
endforeach()

set(LFM2_HDF5_VERSION_TEXT "${HDF5_VERSION}")
set(LFM2_COMPILER_TEXT "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}")
set(LFM2_GENERATED_DIR "${CMAKE_BINARY_DIR}/generated")
configure_file("${PROJECT_SOURCE_DIR}/cmake/build_info.h.in" "${LFM2_GENERATED_DIR}/lfm2/build_info.h" @ONLY)

add_custom_target(lfm2_commit ALL
  COMMAND ${CMAKE_COMMAND} -DSRC=${PROJECT_SOURCE_DIR} -DOUT=${LFM2_GENERATED_DIR}/lfm2/build_commit.h
          -DFALLBACK=${LFM2_COMMIT} -P ${PROJECT_SOURCE_DIR}/cmake/write_commit.cmake
  BYPRODUCTS ${LFM2_GENERATED_DIR}/lfm2/build_commit.h
  COMMENT "lfm2: the commit for --version" VERBATIM)

function(lfm2_use_build_info target)
  target_include_directories(${target} PRIVATE ${LFM2_GENERATED_DIR})
  add_dependencies(${target} lfm2_commit)
endfunction()
