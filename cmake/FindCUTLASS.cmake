# FindCUTLASS: the CUTLASS C++ headers (header-only), as scripts/setup.sh installs them from the
# PyPI wheel nvidia-cutlass into .deps/cutlass-<version>/include.
#
#   LFM2_CUTLASS_DIR   cache variable: the folder holding include/cutlass/version.h
#                      (default ${PROJECT_SOURCE_DIR}/.deps/cutlass-4.2.0)
#
# Defines CUTLASS_FOUND, CUTLASS_INCLUDE_DIR, CUTLASS_VERSION and the imported target
# CUTLASS::cutlass (include directories only, as SYSTEM so its warnings stay out of ours).
# A version below the one asked for in find_package(CUTLASS <version>) is an error.
set(LFM2_CUTLASS_DIR "${PROJECT_SOURCE_DIR}/.deps/cutlass-4.2.0" CACHE PATH
    "CUTLASS headers: the folder that holds include/cutlass/version.h (scripts/setup.sh fetches them)")

# a changed LFM2_CUTLASS_DIR must not keep finding the old copy through the cache
if(DEFINED _LFM2_CUTLASS_DIR_SEEN AND NOT _LFM2_CUTLASS_DIR_SEEN STREQUAL LFM2_CUTLASS_DIR)
  unset(CUTLASS_INCLUDE_DIR CACHE)
endif()
set(_LFM2_CUTLASS_DIR_SEEN "${LFM2_CUTLASS_DIR}" CACHE INTERNAL "")

find_path(CUTLASS_INCLUDE_DIR cutlass/version.h
          HINTS "${LFM2_CUTLASS_DIR}/include" "${LFM2_CUTLASS_DIR}"
          NO_DEFAULT_PATH)
find_path(CUTLASS_INCLUDE_DIR cutlass/version.h)

if(CUTLASS_INCLUDE_DIR)
  file(STRINGS "${CUTLASS_INCLUDE_DIR}/cutlass/version.h" _cutlass_defs
       REGEX "^#define CUTLASS_(MAJOR|MINOR|PATCH) [0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define CUTLASS_${_part} ([0-9]+).*" "\\1" _cutlass_${_part} "${_cutlass_defs}")
  endforeach()
  set(CUTLASS_VERSION "${_cutlass_MAJOR}.${_cutlass_MINOR}.${_cutlass_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUTLASS
  REQUIRED_VARS CUTLASS_INCLUDE_DIR
  VERSION_VAR CUTLASS_VERSION
  REASON_FAILURE_MESSAGE
    "the CUDA backend needs the CUTLASS headers: run scripts/setup.sh (it fetches the nvidia-cutlass wheel into .deps/), or set -DLFM2_CUTLASS_DIR=<folder with include/cutlass/version.h>, or build without CUDA (-DLFM2_ENABLE_CUDA=OFF)")

if(CUTLASS_FOUND AND NOT TARGET CUTLASS::cutlass)
  add_library(CUTLASS::cutlass INTERFACE IMPORTED)
  set_target_properties(CUTLASS::cutlass PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${CUTLASS_INCLUDE_DIR}")
  set_target_properties(CUTLASS::cutlass PROPERTIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${CUTLASS_INCLUDE_DIR}")
endif()
mark_as_advanced(CUTLASS_INCLUDE_DIR)
