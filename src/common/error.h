// One error type and the check macros of the whole project.
//
// Every check throws lfm2::Error with "file:line: what: message". Programs catch it at the top,
// print one line (prefixed with the rank where there is one) and end nonzero; lfm2-rank turns an
// error after start-up into an abort of every rank (src/rank/fatal.h). None of these macros compiles
// to nothing in any build.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace lfm2 {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait for another process that ran past its deadline (--timeout): the consequence of a peer that
// stopped or died, not a fault of the rank that reports it (src/rank/fatal.h lets the lowest such
// rank speak).
// What the rank waited for decides which of several timed-out ranks speaks (src/rank/fatal.cpp):
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
