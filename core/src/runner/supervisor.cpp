// The relaunch's supervisor (supervisor.hpp).
#include "runner/supervisor.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "comm/job_end_note.hpp"
#include "strata/types.hpp"

namespace strata {
namespace {

constexpr int kPassedOn[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};
std::atomic<unsigned> g_pending{0};  // bit N: signal N arrived, not yet passed on
std::atomic<int> g_interrupts{0};    // Ctrl-C twice: end the job now

extern "C" void on_launcher_signal(int sig) {
  g_pending.fetch_or(1u << sig);
  if (sig == SIGINT) g_interrupts.fetch_add(1);
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The processes whose parent is `parent` (/proc/PID/stat: "pid (comm) state ppid ..."), with
// those that have exited but are not yet waited for (zombies) or without.
std::vector<pid_t> children_of(pid_t parent, bool with_zombies = true) {
  std::vector<pid_t> found;
  DIR* proc = ::opendir("/proc");
  if (!proc) return found;
  while (const dirent* e = ::readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const auto close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(close_paren + 1));
    char state = 0;
    long ppid = 0;
    if (rest >> state >> ppid && ppid == parent && (with_zombies || state != 'Z'))
      found.push_back(pid_t(std::atol(e->d_name)));
  }
  ::closedir(proc);
  return found;
}

// Passes the signals that arrived on: to the ranks, or to srun (supervisor.hpp).
void pass_on(pid_t child, const Supervision& how, unsigned pending) {
  for (int sig = 1; sig < 32; ++sig) {
    if (!(pending & (1u << sig))) continue;
    if (!how.direct_to_ranks) {
      ::kill(child, sig == SIGUSR1 || sig == SIGUSR2 ? sig : SIGTERM);
      continue;
    }
    const std::vector<pid_t> ranks = children_of(child);
    if (ranks.empty()) ::kill(child, SIGTERM);  // none started yet: mpirun ends the job
    for (pid_t r : ranks) ::kill(r, sig);
  }
}

// Copies what is readable on `from` to `to`; false at end of file. A closed `to` (EPIPE) is
// noted in *closed and what follows is dropped.
bool relay(int from, int to, bool* closed) {
  char buf[16384];
  const ssize_t n = ::read(from, buf, sizeof buf);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return false;
  for (ssize_t done = 0; n > 0 && !*closed && done < n;) {
    const ssize_t w = ::write(to, buf + done, std::size_t(n - done));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      *closed = true;
      if (errno == EPIPE) g_pending.fetch_or(1u << SIGPIPE);
      break;
    }
    done += w;
  }
  return true;
}

// The job-end note (comm/job_end_note.hpp) of a supervised mpirun.
struct EndNote {
  std::string path;  // empty: none expected (srun, or no folder of our own)
  std::optional<int> code;
  double seen_at = 0;

  // True once the job is over but for mpirun's kill sequence: the note is there and the ranks
  // are gone (a tenth of a second for mpirun to pass on their last output), or a second has
  // passed since the note (a rank that ignores the end: it is killed with mpirun).
  bool job_over(pid_t launcher) {
    if (path.empty()) return false;
    if (!code && !(code = read_job_end_note(path))) return false;
    if (seen_at == 0) seen_at = seconds_now();
    const double waited = seconds_now() - seen_at;
    return waited > 1 || (waited > 0.1 && children_of(launcher, false).empty());
  }
};

// Ends mpirun and whatever is left of its ranks at once, without its clean-up: their files are
// in the job's own folder, which run_supervised removes.
void end_launcher_now(pid_t launcher) {
  for (pid_t rank : children_of(launcher)) ::kill(rank, SIGKILL);
  ::kill(-launcher, SIGKILL);
}

pid_t start_child(const std::vector<std::string>& cmd, int out_w, int err_w) {
  std::vector<char*> args;
  for (const std::string& a : cmd) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0)
    throw Error(std::string("cannot start ") + cmd[0] + ": fork: " + std::strerror(errno));
  if (pid == 0) {
    // Its own process group: a terminal's Ctrl-C reaches the launcher, which passes it on once.
    ::setpgid(0, 0);
    ::dup2(out_w, STDOUT_FILENO);
    ::dup2(err_w, STDERR_FILENO);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "runner: error: cannot execute %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  return pid;
}

}  // namespace

int run_supervised(const std::vector<std::string>& cmd, Supervision how) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    throw Error(std::string("cannot start ") + cmd[0] + ": pipe: " + std::strerror(errno));
  EndNote note;
  if (!how.job_dir.empty()) {
    note.path = how.job_dir + "/end";
    ::setenv(kJobEndNoteVariable, note.path.c_str(), 1);  // for the ranks, through mpirun
  }
  const pid_t child = start_child(cmd, out[1], err[1]);
  ::close(out[1]);
  ::close(err[1]);
  struct sigaction sa {};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : kPassedOn) ::sigaction(sig, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a closed output is a write error here (relay), then passed on
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  bool closed[2] = {false, false};
  int status = 0;
  bool exited = false;
  double deadline = 0;  // once a signal was passed on: when the job is ended the hard way
  bool hard = false;
  bool ended_here = false;  // by the job-end note
  while (!exited || fds[0].fd >= 0 || fds[1].fd >= 0) {
    ::poll(fds, 2, exited ? 0 : 100);
    int readable = 0;
    for (int i = 0; i < 2; ++i)
      if (fds[i].fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) {
        ++readable;
        if (!relay(fds[i].fd, i == 0 ? STDOUT_FILENO : STDERR_FILENO, &closed[i])) {
          ::close(fds[i].fd);
          fds[i].fd = -1;
        }
      }
    if (exited && readable == 0) break;  // a grandchild may hold the pipes: stop once drained
    if (const unsigned pending = g_pending.exchange(0); pending && !exited) {
      pass_on(child, how, pending);
      if (deadline == 0) deadline = seconds_now() + 60;  // the ranks' own cancel takes seconds
    }
    if (!hard && !exited && (g_interrupts >= 2 || (deadline > 0 && seconds_now() > deadline))) {
      ::kill(-child, SIGTERM);
      hard = true;
    }
    if (!exited && !ended_here && note.job_over(child)) {
      end_launcher_now(child);
      ended_here = true;
    }
    if (!exited) exited = ::waitpid(child, &status, WNOHANG) == child;
  }
  for (int i = 0; i < 2; ++i)
    if (fds[i].fd >= 0) ::close(fds[i].fd);
  if (!exited) ::waitpid(child, &status, 0);
  if (!how.job_dir.empty()) {
    if (!note.code) note.code = read_job_end_note(note.path);  // mpirun ended before we looked
    std::error_code ignored;
    std::filesystem::remove_all(how.job_dir, ignored);
  }
  // The note's code is the one the run file's status implies, also where mpirun would put its
  // own (137 for a rank it saw killed; run/exit_codes.hpp).
  if (note.code) return *note.code;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace strata
