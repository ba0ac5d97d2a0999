// The text front end as a subprocess (text_front_end.h): posix_spawn with its stdout and stderr in
// one pipe, read until it closes or the deadline passes, then the child reaped (or killed).
#include "rank/jobs/text_front_end.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"

extern char** environ;

namespace lfm2 {
namespace {

namespace fs = std::filesystem;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string find_script() {
  const std::string given = env_or("LFM2_TEXT_TOOL", "");
  if (!given.empty()) return given;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path() / ".." / "share" / "lfm2-rank" / "tools" / "lfm2_text.py";
    if (fs::is_regular_file(installed, ec)) return installed.lexically_normal().string();
  }
  return std::string(LFM2_SOURCE_DIR) + "/tools/lfm2_text.py";
}

// The front end's lines: its error line when there is one, else its last line.
std::string pick_line(const std::string& out, bool failed) {
  std::vector<std::string> lines;
  size_t at = 0;
  while (at < out.size()) {
    size_t end = out.find('\n', at);
    if (end == std::string::npos) end = out.size();
    if (end > at) lines.push_back(out.substr(at, end - at));
    at = end + 1;
  }
  const std::string tag = "lfm2_text: error: ";
  for (const std::string& l : lines)
    if (failed && l.rfind(tag, 0) == 0) return l.substr(tag.size());
  return lines.empty() ? std::string() : lines.back();
}

// Reads the child's output until it closes or the deadline passes; false on the deadline.
bool read_until(int fd, double deadline, std::string* out) {
  char buf[4096];
  for (;;) {
    const double left = deadline - now_s();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, int(std::min(left, 1.0) * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
    out->append(buf, size_t(n));
  }
}

}  // namespace

std::string derived_path(const std::string& results, const std::string& suffix) {
  std::string stem = results;
  for (const char* ext : {".jsonl", ".json"}) {
    const std::string e(ext);
    if (stem.size() > e.size() && stem.compare(stem.size() - e.size(), e.size(), e) == 0) {
      stem.resize(stem.size() - e.size());
      break;
    }
  }
  return stem + suffix;
}

std::vector<std::string> front_end_command() { return {env_or("LFM2_PYTHON", "python3"), find_script()}; }

std::string run_front_end(const std::vector<std::string>& args, double timeout_s) {
  std::vector<std::string> cmd = front_end_command();
  cmd.insert(cmd.end(), args.begin(), args.end());
  std::string shown;
  for (const auto& a : cmd) shown += (shown.empty() ? "" : " ") + a;
  log_debug("text front end: " + shown);
  int fds[2];
  LFM2_CHECK(pipe2(fds, O_CLOEXEC) == 0, "text front end: pipe: ", std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  std::vector<char*> argv;
  for (auto& a : cmd) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    LFM2_FAIL("the text front end did not start (", cmd[0], ": ", std::strerror(rc),
              "; set LFM2_PYTHON to a Python 3 with tools/requirements-text.txt)");
  }
  std::string out;
  const bool in_time = read_until(fds[0], now_s() + timeout_s, &out);
  close(fds[0]);
  if (!in_time) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  LFM2_CHECK(in_time, "the text front end (", args.at(0), ") took longer than --timeout ", timeout_s, " s: killed");
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  const std::string line = pick_line(out, !ok);
  if (!ok) {
    LFM2_CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 127), "the text front end did not start (", cmd[0],
               " ", cmd[1], ": ", line, ")");
    // The front end's own line names the file, line and field: it is the whole message.
    throw Error(line.empty() ? cat("the text front end (", args.at(0), ") failed with no message") : line);
  }
  return line;
}

void encode_prompts(const RankOptions& opt, const std::string& model_file) {
  log_info(run_front_end({"encode", model_file, opt.prompts, opt.inputs}, opt.timeout_s));
}

std::string decode_results(const RankOptions& opt, const std::string& model_file) {
  std::vector<std::string> args{"decode", model_file, opt.output, opt.results, "--inputs", opt.inputs};
  for (int64_t e : opt.eos) args.push_back(cat("--eos=", e));
  if (opt.eos.empty()) args.push_back("--no-eos");  // the run stopped at none: neither may the text
  return run_front_end(args, opt.timeout_s);
}

}  // namespace lfm2
