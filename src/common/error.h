// One error type and the check macros of the whole project, all here: LFM2_CHECK / LFM2_FAIL, the
// timeouts, and one per library that returns a status (MPI_CHECK, H5_CHECK, CUDA_CHECK,
// CUDA_CHECK_LAUNCH, CUBLAS_CHECK, NCCL_CHECK). A library's macro expands only where that library's
// header is included (and, for MPI and HDF5, the header that turns a status into text).
//
// Every check throws lfm2::Error with "file:line: what: message". Programs catch it at the top,
// print one line (prefixed with the rank where there is one) and end nonzero; lfm2-rank turns an
// error after start-up into an abort of every rank (src/rank/mpi/fatal.h). None of these macros
// compiles to nothing in any build.
#pragma once

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

namespace lfm2 {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait for another process that ran past its deadline (--timeout): the consequence of a peer that
// stopped or died, not a fault of the rank that reports it (src/rank/mpi/fatal.h lets the lowest such
// rank speak).
// What the rank waited for decides which of several timed-out ranks speaks (src/rank/mpi/fatal.cpp):
// a receive (or a reply) from one peer, a send to one peer, or all ranks (an agreement, a barrier).
enum class TimeoutKind { kReceive, kSend, kGroup };
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& msg, TimeoutKind kind = TimeoutKind::kReceive) : Error(msg), kind_(kind) {}
  TimeoutKind kind() const { return kind_; }

 private:
  TimeoutKind kind_;
};

// NaN or +-Inf where a finite value must be (src/model/checked_stage.h); its own exit code.
class NonFiniteError : public Error {
 public:
  using Error::Error;
};

// Builds "a b c" from any streamable parts: throw Error(cat("bad shape ", n)).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void throw_error(const char* file, int line, const std::string& what, const std::string& msg);
[[noreturn]] void throw_timeout(const char* file, int line, const std::string& msg, TimeoutKind kind);

// CUDA_CHECK_LAUNCH: true when LFM2_SYNC_CHECK is set to anything but "" or "0" (read once), and
// then each launch synchronises the device, so that an asynchronous fault is reported at the launch
// that caused it (debugging only: it serialises everything).
inline bool cuda_sync_check_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("LFM2_SYNC_CHECK");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// CUBLAS_CHECK: a cuBLAS status as text (plain ints, so that this header needs no cublas_v2.h).
inline const char* cublas_status_text(int status) {
  switch (status) {
    case 0: return "CUBLAS_STATUS_SUCCESS";
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_(unknown)";
  }
}

}  // namespace lfm2

// Plain condition check with a message built from the trailing arguments.
#define LFM2_CHECK(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) ::lfm2::throw_error(__FILE__, __LINE__, #cond, ::lfm2::cat(__VA_ARGS__)); \
  } while (0)

#define LFM2_FAIL(...) ::lfm2::throw_error(__FILE__, __LINE__, "error", ::lfm2::cat(__VA_ARGS__))

// A wait that ran past its deadline: throws lfm2::TimeoutError. LFM2_TIMEOUT for one from a peer,
// LFM2_SEND_TIMEOUT for a send to a peer, LFM2_GROUP_TIMEOUT for a wait on all ranks.
#define LFM2_TIMEOUT(...) \
  ::lfm2::throw_timeout(__FILE__, __LINE__, ::lfm2::cat(__VA_ARGS__), ::lfm2::TimeoutKind::kReceive)
#define LFM2_SEND_TIMEOUT(...) \
  ::lfm2::throw_timeout(__FILE__, __LINE__, ::lfm2::cat(__VA_ARGS__), ::lfm2::TimeoutKind::kSend)
#define LFM2_GROUP_TIMEOUT(...) \
  ::lfm2::throw_timeout(__FILE__, __LINE__, ::lfm2::cat(__VA_ARGS__), ::lfm2::TimeoutKind::kGroup)

// A call into a library that returns a status: MPI (needs mpi.h and lfm2::mpi_error_string,
// src/rank/mpi/world.h, which makes MPI's text of the code). The rest names what was being done.
#define MPI_CHECK(expr, ...)                                                                        \
  do {                                                                                              \
    int mpi_check_rc_ = (expr);                                                                     \
    if (mpi_check_rc_ != MPI_SUCCESS)                                                               \
      ::lfm2::throw_error(__FILE__, __LINE__, #expr,                                                \
                          ::lfm2::cat(__VA_ARGS__, ": ", ::lfm2::mpi_error_string(mpi_check_rc_))); \
  } while (0)

// HDF5: `expr` returns a negative herr_t / hid_t on failure (needs hdf5.h and
// lfm2::h5_error_message, src/io/h5_util.h). The rest names what was being done.
#define H5_CHECK(expr, ...)                                                                          \
  do {                                                                                               \
    if ((expr) < 0)                                                                                  \
      ::lfm2::throw_error(__FILE__, __LINE__, #expr,                                                 \
                          ::lfm2::cat(__VA_ARGS__, ": ", ::lfm2::h5_error_message()));               \
  } while (0)

// The CUDA runtime (needs cuda_runtime_api.h; common/cuda_check.h includes it).
#define CUDA_CHECK(call)                                                                              \
  do {                                                                                                \
    cudaError_t lfm2_cuda_err_ = (call);                                                              \
    if (lfm2_cuda_err_ != cudaSuccess)                                                                \
      ::lfm2::throw_error(__FILE__, __LINE__, #call,                                                  \
                          ::lfm2::cat("CUDA error ", cudaGetErrorName(lfm2_cuda_err_), ": ",         \
                                      cudaGetErrorString(lfm2_cuda_err_)));                           \
  } while (0)

// After a kernel launch: the launch error, and with LFM2_SYNC_CHECK=1 the kernel's own fault.
// `what` names the kernel in the message.
#define CUDA_CHECK_LAUNCH(what)                                                                       \
  do {                                                                                                \
    cudaError_t lfm2_cuda_err_ = cudaGetLastError();                                                  \
    if (lfm2_cuda_err_ == cudaSuccess && ::lfm2::cuda_sync_check_enabled())                           \
      lfm2_cuda_err_ = cudaDeviceSynchronize();                                                       \
    if (lfm2_cuda_err_ != cudaSuccess)                                                                \
      ::lfm2::throw_error(__FILE__, __LINE__, ::lfm2::cat("launch of ", what),                       \
                          ::lfm2::cat("CUDA error ", cudaGetErrorName(lfm2_cuda_err_), ": ",         \
                                      cudaGetErrorString(lfm2_cuda_err_)));                           \
  } while (0)

// cuBLAS (statuses as plain ints).
#define CUBLAS_CHECK(call)                                                                            \
  do {                                                                                                \
    int lfm2_cublas_st_ = static_cast<int>(call);                                                     \
    if (lfm2_cublas_st_ != 0)                                                                         \
      ::lfm2::throw_error(__FILE__, __LINE__, #call,                                                  \
                          ::lfm2::cat("cuBLAS error ", ::lfm2::cublas_status_text(lfm2_cublas_st_),  \
                                      " (", lfm2_cublas_st_, ")"));                                   \
  } while (0)

// NCCL (needs nccl.h: ncclGetErrorString, ncclGetLastError).
#define NCCL_CHECK(call)                                                                              \
  do {                                                                                                \
    ncclResult_t lfm2_nccl_res_ = (call);                                                             \
    if (lfm2_nccl_res_ != ncclSuccess && lfm2_nccl_res_ != ncclInProgress)                            \
      ::lfm2::throw_error(__FILE__, __LINE__, #call,                                                  \
                          ::lfm2::cat("NCCL error ", ncclGetErrorString(lfm2_nccl_res_), ": ",       \
                                      ncclGetLastError(nullptr)));                                    \
  } while (0)
