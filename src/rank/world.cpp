#include "rank/world.h"

#include "common/error.h"

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

}  // namespace lfm2
