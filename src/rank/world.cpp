#include "rank/world.h"

#include <climits>

#include "common/error.h"
#include "rank/transport.h"

namespace lfm2 {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return cat("MPI error ", code);
  return std::string(text, size_t(len));
}

WorldConfig query_world() {
  WorldConfig w;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &w.rank), "MPI rank");
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &w.size), "MPI size");
  MPI_Comm local;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &local),
            "node-local communicator");
  MPI_CHECK(MPI_Comm_rank(local, &w.local_rank), "node-local rank");
  MPI_CHECK(MPI_Comm_size(local, &w.local_size), "node-local size");
  MPI_CHECK(MPI_Allreduce(&w.rank, &w.node, 1, MPI_INT, MPI_MIN, local), "naming the node");
  MPI_Comm_free(&local);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &len), "processor name");
  w.host.assign(name, size_t(len));
  return w;
}

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  LFM2_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed: ", mpi_error_string(rc));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void barrier(const WorldConfig& world, double timeout_s, const std::string& what) {
  MPI_Request req;
  MPI_CHECK(MPI_Ibarrier(world.comm, &req), what);
  wait_mpi_request(&req, timeout_s, what);
}

std::vector<std::string> gather_strings(const WorldConfig& world, const std::string& mine, double timeout_s,
                                        const std::string& what) {
  LFM2_CHECK(mine.size() <= size_t(INT_MAX), what, ": ", mine.size(), " bytes is over MPI's int count");
  const int len = int(mine.size());
  std::vector<int> lens(size_t(world.size), 0);
  MPI_Request req;
  MPI_CHECK(MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, world.comm, &req), what);
  wait_mpi_request(&req, timeout_s, what);
  std::vector<int> displs(size_t(world.size), 0);
  int64_t total = 0;
  for (int r = 0; r < world.size; ++r) {
    displs[size_t(r)] = int(total);
    total += lens[size_t(r)];
  }
  LFM2_CHECK(total <= INT_MAX, what, ": ", total, " bytes in all is over MPI's int count");
  std::string all(size_t(world.is_first() ? total : 0), '\0');
  MPI_CHECK(MPI_Igatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, world.comm,
                         &req),
            what);
  wait_mpi_request(&req, timeout_s, what);
  std::vector<std::string> out;
  if (world.is_first())
    for (int r = 0; r < world.size; ++r) out.push_back(all.substr(size_t(displs[size_t(r)]), size_t(lens[size_t(r)])));
  return out;
}

}  // namespace lfm2
