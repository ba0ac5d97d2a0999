#include "rank/mpi/world.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

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
  MPI_CHECK(MPI_Allreduce(&w.rank, &w.node, 1, MPI_INT, MPI_MIN, local), "naming the node");
  MPI_Comm_free(&local);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &len), "processor name");
  w.host.assign(name, size_t(len));
  // Blocking like the split above; main() bounds both with its watchdog.
  std::vector<char> all(size_t(w.size) * MPI_MAX_PROCESSOR_NAME, '\0');
  std::copy(name, name + len, all.begin() + ptrdiff_t(w.rank) * MPI_MAX_PROCESSOR_NAME);
  MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                          MPI_COMM_WORLD),
            "gathering the host names");
  for (int r = 0; r < w.size; ++r) {
    const char* h = all.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME;
    w.hosts.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
  }
  return w;
}

bool WorldConfig::multi_host() const {
  for (const auto& h : hosts)
    if (h != host) return true;
  return false;
}

std::string WorldConfig::host_of(int r) const {
  const int w = r >= 0 && r < size ? world_rank(r) : -1;
  return w >= 0 && w < int(hosts.size()) ? hosts[size_t(w)] : std::string();
}

std::string WorldConfig::rank_name(int r) const {
  const bool known = r >= 0 && r < size;
  std::string s = cat("rank ", known ? world_rank(r) : r);
  if (known && n_replicas > 1 && !world_ranks.empty()) s += cat(" (replica ", replica, " stage ", r, ")");
  if (known && multi_host()) s += cat(" on ", host_of(r));
  return s;
}

bool poll_until(const std::function<bool()>& done, double timeout_s) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(timeout_s);
  for (int spin = 0; spin < 200; ++spin)
    if (done()) return true;
  // Sleeping rather than spinning leaves the cores to the compute threads of the other ranks.
  auto nap = std::chrono::microseconds(20);
  while (!done()) {
    if (clock::now() >= deadline) return false;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
  return true;
}

void wait_mpi_request(MPI_Request* req, double timeout_s, const std::string& what) {
  auto done = [&] {
    int flag = 0;
    MPI_CHECK(MPI_Test(req, &flag, MPI_STATUS_IGNORE), what);
    return flag != 0;
  };
  if (!poll_until(done, timeout_s))
    LFM2_GROUP_TIMEOUT("timed out after ", timeout_s, " s in ", what, " (a rank stopped? see --timeout)");
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

namespace {

// The barrier's messages: above every tag of the pipeline (0 .. 32766) and the report (32767).
constexpr int kArrivalTag = 32768;

bool arrival_tag_allowed(MPI_Comm comm) {
  void* ub = nullptr;
  int flag = 0;
  return MPI_Comm_get_attr(comm, MPI_TAG_UB, &ub, &flag) == MPI_SUCCESS && flag && *static_cast<int*>(ub) >= kArrivalTag;
}

// Waits for every request against the deadline; false on timeout.
bool wait_all(std::vector<MPI_Request>& reqs, double timeout_s, const std::string& what) {
  return poll_until(
      [&] {
        int flag = 0;
        MPI_CHECK(MPI_Testall(int(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), what);
        return flag != 0;
      },
      timeout_s);
}

}  // namespace

std::string name_ranks(const WorldConfig& world, const std::vector<int>& ranks) {
  std::string s;
  if (world.n_replicas > 1 && !world.world_ranks.empty()) {  // a replica's ranks need not be consecutive
    for (int r : ranks) s += cat(s.empty() ? "" : ", ", world.rank_name(r));
    return s;
  }
  auto host = [&](size_t k) { return world.multi_host() ? world.host_of(ranks[k]) : std::string(); };
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1 && host(j + 1) == host(i)) ++j;
    s += cat(s.empty() ? "" : ", ", j > i ? cat("ranks ", ranks[i], "-", ranks[j]) : cat("rank ", ranks[i]),
             host(i).empty() ? "" : " on ", host(i));
    i = j + 1;
  }
  return s;
}

// Every rank tells rank 0 that it arrived and waits for rank 0's go, so that a rank 0 whose wait
// times out knows which ranks never came and names them, with their hosts: the rank or node that
// stalled or lost its link. (An MPI_Ibarrier, where the tag is not allowed, knows no names.)
void barrier(const WorldConfig& world, double timeout_s, const std::string& what) {
  if (world.size == 1) return;
  if (!arrival_tag_allowed(world.comm)) {
    MPI_Request req;
    MPI_CHECK(MPI_Ibarrier(world.comm, &req), what);
    wait_mpi_request(&req, timeout_s, what);
    return;
  }
  char token = 1;
  std::vector<char> tokens(size_t(world.size), 0);
  std::vector<MPI_Request> reqs;
  if (!world.is_first()) {
    reqs.assign(2, MPI_REQUEST_NULL);
    MPI_CHECK(MPI_Isend(&token, 1, MPI_CHAR, 0, kArrivalTag, world.comm, &reqs[0]), what);
    MPI_CHECK(MPI_Irecv(&tokens[0], 1, MPI_CHAR, 0, kArrivalTag, world.comm, &reqs[1]), what);
    if (!wait_all(reqs, timeout_s, what))
      LFM2_GROUP_TIMEOUT("timed out after ", timeout_s, " s in ", what, " (a rank stopped? see --timeout)");
    return;
  }
  reqs.assign(size_t(world.size), MPI_REQUEST_NULL);
  for (int r = 1; r < world.size; ++r)
    MPI_CHECK(MPI_Irecv(&tokens[size_t(r)], 1, MPI_CHAR, r, kArrivalTag, world.comm, &reqs[size_t(r)]), what);
  if (!wait_all(reqs, timeout_s, what)) {
    std::vector<int> missing;
    for (int r = 1; r < world.size; ++r) {
      int flag = 0;
      MPI_CHECK(MPI_Test(&reqs[size_t(r)], &flag, MPI_STATUS_IGNORE), what);
      if (!flag) missing.push_back(r);
    }
    LFM2_GROUP_TIMEOUT("timed out after ", timeout_s, " s in ", what, ": ", name_ranks(world, missing),
                 missing.size() > 1 ? " have" : " has", " not arrived (stopped, or cut off? see --timeout)");
  }
  for (int r = 1; r < world.size; ++r)
    MPI_CHECK(MPI_Isend(&token, 1, MPI_CHAR, r, kArrivalTag, world.comm, &reqs[size_t(r)]), what);
  if (!wait_all(reqs, timeout_s, what))
    LFM2_GROUP_TIMEOUT("timed out after ", timeout_s, " s in ", what, " (a rank stopped? see --timeout)");
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
