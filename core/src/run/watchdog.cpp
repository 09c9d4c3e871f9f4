// The watchdog (watchdog.hpp). Rank 0 is the judge: it hears every rank's heartbeat, with what the
// rank is blocked in, and so can name a rank that went silent instead of the ranks waiting for it.
// When rank 0 itself goes silent, rank 1 writes the failure file in its place.
#include "run/watchdog.hpp"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_transport.hpp"
#include "comm/transport.hpp"
#include "run/exit_codes.hpp"
#include "run/run_state.hpp"
#include "util/format.hpp"

namespace strata {
namespace {

// Set by the handler, read by the watchdog thread: a lock-free atomic is both signal-safe and
// thread-safe (a volatile sig_atomic_t is only the former; TSan reported the race).
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_signal(int sig) {
  if (g_signal != 0 && sig == SIGINT) std::_Exit(128 + sig);  // a second Ctrl-C: leave now
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);  // the first signal is the one the file names
}

// SIGBUS: a fault on the thread that touched the memory, which cannot go on (returning would
// fault again). It parks here while the watchdog thread writes the run file and ends the job.
extern "C" void on_fault(int sig) {
  on_signal(sig);
  for (;;) ::pause();
}

bool is_fault(int sig) { return sig == SIGBUS; }

// Why a signal came, for the run file.
const char* signal_cause(int sig) {
  switch (sig) {
    case SIGPIPE:
      return "its output went to a pipe whose reader exited, e.g. `| head`, or a socket closed";
    case SIGBUS:
      return "a bus error: memory mapped from a file that shrank, or /dev/shm full";
    default:
      return "scancel, Slurm's time limit or --signal, the launcher, Ctrl-C or a closed session";
  }
}

// A signal's name: "SIGHUP", "SIGUSR1", ... (glibc's table); SIGTERM when none was caught.
std::string signal_name(int sig) {
  const char* abbrev = sig > 0 ? sigabbrev_np(sig) : nullptr;
  return std::string("SIG") + (abbrev ? abbrev : "TERM");
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

// "all_reduce on group dp (482304 bytes)"
std::string describe(const InFlight& f) {
  return std::string(op_name(f.op)) + " on group " + f.group + " (" + std::to_string(f.bytes) +
         " bytes)";
}

}  // namespace

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  // SIGHUP: the terminal or the session went away; SIGUSR1/2: what Slurm's --signal=USR1@N and
  // batch systems send ahead of the time limit; SIGPIPE: the output's reader went away (`| head`;
  // the write itself then fails with EPIPE, and a transport's socket write sees its error as
  // before). Their default action would end the rank without a word.
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGPIPE}) sigaction(sig, &sa, nullptr);
  sa.sa_handler = on_fault;
  sigaction(SIGBUS, &sa, nullptr);
}

struct Watchdog::Impl {
  Impl(double timeout, RunState& run) : timeout_s(timeout), state(run) {}
  double timeout_s;
  RunState& state;
  // Held while the ledger is read, so that attach(nullptr) returns only once this thread has let
  // go of it: train() detaches and then destroys its ledger (also when it unwinds on an error).
  mutable std::mutex ledger_mu;
  CommLedger* ledger = nullptr;
  std::atomic<bool> stop{false};
  std::thread thread;
  int rank = 0, world = 1;
  double interval = 1;             // between heartbeats
  std::vector<double> last_seen;   // rank 0: when each rank was last heard
  std::vector<std::string> doing;  // rank 0: what each rank last said it is blocked in
  double root_seen = 0;            // other ranks: when rank 0 was last heard
  bool reported = false;           // other ranks: a timeout went to rank 0 already
  double reported_at = 0;
  // False once this process was frozen (SIGSTOP, a debugger) for more than half the timeout: the
  // others may have declared it gone and written the file (they count its silence from its last
  // heartbeat, up to an interval before the freeze, and a loaded machine delays this thread's
  // waking); from then on it never replaces that file.
  bool may_replace = true;

  // The oldest blocking call of this rank, with its start time; false when not blocked.
  bool oldest_call(InFlight* out) const {
    std::vector<InFlight> calls = mpi::control_in_flight();
    {
      std::lock_guard lock(ledger_mu);
      if (ledger) {
        std::vector<InFlight> more = ledger->in_flight();
        calls.insert(calls.end(), more.begin(), more.end());
      }
    }
    if (calls.empty()) return false;
    *out = *std::min_element(calls.begin(), calls.end(),
                             [](const InFlight& a, const InFlight& b) { return a.t0 < b.t0; });
    return true;
  }

  // "all_reduce on group dp (482304 bytes) for 3.1 s", or "" when not blocked.
  std::string blocked_in(double t) const {
    InFlight f;
    return oldest_call(&f) ? describe(f) + " for " + seconds(t - f.t0) : "";
  }

  // Write the run file, then end every rank: the others exit when rank 0 says so (a launcher may
  // take seconds to act on MPI_Abort, longer with a stopped rank), MPI_Abort covers the rest.
  [[noreturn]] void end_job(const std::string& status, const std::string& message, int code,
                            bool replace) {  // code: exit_codes.hpp
    request_comm_stop();  // a transport wait that polls (NCCL's) gives up instead of spinning
    std::fprintf(stderr, "runner: error: %s\n", one_line(message).c_str());
    code = write_failure(state, status, message, code, replace && may_replace);
    if (rank == 0)
      for (int r = 1; r < world; ++r)
        mpi::post_notice(r, mpi::Notice::ending, std::to_string(code));
    std::fflush(nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    mpi::abort_job(code);
  }

  // Other ranks: rank 0 has written the file and ends the job.
  void exit_if_ending() {
    int from = 0;
    std::string code;
    if (!mpi::poll_notice(mpi::Notice::ending, &from, &code)) return;
    std::fflush(nullptr);
    std::_Exit(std::atoi(code.c_str()));
  }

  // Other ranks: up to 15 s for rank 0 to write the file and end the job (exit_if_ending).
  void await_ending() {
    for (int i = 0; i < 1500; ++i) {
      exit_if_ending();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  void heartbeat(double t) {
    if (rank == 0) {
      for (int r = 1; r < world; ++r) mpi::post_notice(r, mpi::Notice::heartbeat, "");
    } else {
      mpi::post_notice(0, mpi::Notice::heartbeat, blocked_in(t));
    }
  }

  // Rank 0: what every rank is doing, the silent ones first; at most 8 named.
  std::string diagnosis(double t) const {
    std::string silent, waiting;
    int named = 0, more = 0;
    for (int r = 0; r < world; ++r) {
      // Silent: three heartbeats missed. A rank stopped just after its last heartbeat is silent
      // for a little less than the others have waited when the job is judged hung.
      const bool quiet = r != 0 && t - last_seen[r] > std::min(timeout_s, 3 * interval);
      const std::string what = r == 0 ? blocked_in(t) : doing[r];
      if (!quiet && what.empty()) continue;
      if (named++ >= 8) {
        ++more;
        continue;
      }
      if (quiet)
        silent += (silent.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
                  " stopped responding (no heartbeat for " + seconds(t - last_seen[r]) +
                  ": stopped, hung in the kernel, or its node is gone)";
      else
        waiting += (waiting.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
                   " waits in " + what;
    }
    std::string m = silent.empty() ? "ranks wait on each other" : silent;
    if (!waiting.empty()) m += (silent.empty() ? ": " : "; meanwhile ") + waiting;
    if (more) m += "; and " + std::to_string(more) + " more";
    return m + " (--watchdog " + seconds(timeout_s) + ")";
  }

  // This process was frozen (SIGSTOP, a debugger) after `t` was read, before it judged: the
  // others may have judged it gone and written the file meanwhile. It never replaces that file,
  // and judges in the next round (whose start sees the freeze and starts the clocks anew), not
  // with the stale `t` (which made a rank 0 stopped and resumed replace rank 1's file, saying
  // rank 0 waited -4.1 s).
  bool frozen_since(double t) {
    if (now() - t <= timeout_s / 2) return false;
    may_replace = false;
    return true;
  }

  void root_check(double t) {
    std::string payload;
    int from = 0;
    while (mpi::poll_notice(mpi::Notice::heartbeat, &from, &payload))
      last_seen[from] = t, doing[from] = payload;
    if (frozen_since(t)) return;
    while (mpi::poll_notice(mpi::Notice::error, &from, &payload)) {
      auto bar = payload.find('|');
      const std::string status = bar == std::string::npos ? "failed" : payload.substr(0, bar);
      if (status == "timeout") end_job("timeout", diagnosis(t), exit_code::timeout, true);
      end_job(status, bar == std::string::npos ? payload : payload.substr(bar + 1),
              exit_code::for_status(status), true);
    }
    if (mpi::poll_notice(mpi::Notice::cancel, &from, &payload)) cancel_as_root(from, payload);
    InFlight f;
    bool late = oldest_call(&f) && t - f.t0 > timeout_s;
    for (int r = 1; r < world && !late; ++r) late = t - last_seen[r] > timeout_s;
    if (late) end_job("timeout", diagnosis(t), exit_code::timeout, true);
  }

  void other_check(double t) {
    exit_if_ending();
    std::string payload;
    int from = 0;
    while (mpi::poll_notice(mpi::Notice::heartbeat, &from, &payload)) root_seen = t;
    // Rank 0 is ending the job after another rank's signal: answer, so that it counts us alive.
    while (mpi::poll_notice(mpi::Notice::cancel, &from, &payload)) {
      root_seen = t;
      mpi::post_notice(0, mpi::Notice::cancel, "");
    }
    if (frozen_since(t)) return;
    const bool root_silent = t - root_seen > timeout_s;
    // Rank 0 is gone: rank 1 writes the file (rank 2 too, should rank 1 be gone as well).
    if (root_silent && (rank == 1 || t - root_seen > 2 * timeout_s)) {
      const std::string what = blocked_in(t);
      end_job("timeout",
              "rank 0 stopped responding (no heartbeat for " + seconds(t - root_seen) +
                  ": stopped, hung in the kernel, or its node is gone); rank " +
                  std::to_string(rank) + (what.empty() ? " was not blocked" : " waits in " + what) +
                  " (--watchdog " + seconds(timeout_s) + ")",
              exit_code::timeout, false);
    }
    InFlight f;
    if (!reported && oldest_call(&f) && t - f.t0 > timeout_s) {
      mpi::send_error_to_root("timeout|rank " + std::to_string(rank) + ": " + describe(f));
      reported = true, reported_at = t;
    }
    if (reported && t - reported_at > timeout_s + 10)  // rank 0 did not act
      mpi::abort_job(exit_code::timeout);
  }

  // Rank 0: this rank got a signal, or rank `from` reported one (`note`). Hear every other rank
  // for half a second: those that say nothing were gone before the job was ended (SIGKILL, the OOM
  // killer, a crash), and the file says so; otherwise the job was cancelled.
  [[noreturn]] void cancel_as_root(int from_rank, const std::string& note) {
    for (int r = 1; r < world; ++r) mpi::post_notice(r, mpi::Notice::cancel, "");
    std::vector<bool> heard(world, false);
    heard[0] = heard[from_rank] = true;
    std::string first = note;
    const double until = now() + 0.5;
    int from = 0;
    std::string payload;
    while (std::count(heard.begin(), heard.end(), true) < world && now() < until) {
      while (mpi::poll_notice(mpi::Notice::cancel, &from, &payload)) {
        heard[from] = true;
        if (first.empty()) first = payload;  // a rank's own signal; answers are empty
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // The signal that cancels the job, rank 0's own or the one another rank reported ("N|text"):
    // the exit code is 128 + it, as the file says.
    int sig = SIGTERM;
    if (const auto bar = first.find('|'); bar != std::string::npos) {
      sig = std::max(std::atoi(first.substr(0, bar).c_str()), 1);
      first.erase(0, bar + 1);
    }
    if (g_signal) sig = g_signal, first = "rank 0 got " + signal_name(sig);
    std::string gone;
    for (int r = 0; r < world; ++r)
      if (!heard[r]) gone += (gone.empty() ? "" : ", ") + std::to_string(r);
    const int code = exit_code::cancelled(sig);
    if (!gone.empty())
      end_job("failed",
              "rank(s) " + gone +
                  " ended without a word (killed by a signal such as SIGKILL or the OOM killer, "
                  "or crashed), then the job was ended (" +
                  first + ")",
              exit_code::rank_lost, true);
    end_job("cancelled", "cancelled: " + first + " (" + signal_cause(sig) + ")", code, true);
  }

  // A fault (SIGBUS) on this rank: the run failed, as from an error (end_after_failure).
  [[noreturn]] void fail_on_fault() {
    const int sig = int(g_signal);
    const std::string message = "rank " + std::to_string(rank) + " got " + signal_name(sig) + " (" +
                                signal_cause(sig) + ")";
    if (rank == 0) end_job("failed", message, exit_code::failed, true);
    std::fprintf(stderr, "runner: error: %s\n", message.c_str());
    mpi::send_error_to_root("failed|" + message);
    await_ending();
    mpi::abort_job(exit_code::failed);
  }

  // Other ranks: tell rank 0 and let it write the file; if rank 0 does not answer within a
  // second, it is gone, and rank 1 writes the file itself.
  [[noreturn]] void cancel_as_other() {
    const int sig = int(g_signal);
    mpi::post_notice(
        0, mpi::Notice::cancel,
        std::to_string(sig) + "|rank " + std::to_string(rank) + " got " + signal_name(sig));
    const double until = now() + 1.0;
    int from = 0;
    std::string payload;
    while (now() < until) {
      if (mpi::poll_notice(mpi::Notice::cancel, &from, &payload)) {
        await_ending();
        std::_Exit(128 + sig);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const std::string message =
        "rank 0 ended without a word (killed by a signal such as SIGKILL "
        "or the OOM killer, or crashed), then the job was ended (rank " +
        std::to_string(rank) + " got " + signal_name(sig) + ")";
    if (rank == 1) {
      std::fprintf(stderr, "runner: error: %s\n", message.c_str());
      write_failure(state, "failed", message, exit_code::rank_lost, false);
    }
    std::fflush(nullptr);
    std::_Exit(exit_code::rank_lost);
  }

  void run() {
    rank = mpi::world_rank(), world = mpi::world_size();
    interval = std::clamp(timeout_s / 10, 0.05, 1.0);
    last_seen.assign(world, now());
    doing.assign(world, "");
    root_seen = now();
    double last_beat = -1e9, last_loop = now();
    while (!stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const double t = now();
      if (t - last_loop > std::min(1.0, timeout_s / 2)) {
        // This process was frozen, not the others: their silence is ours. Start the clocks anew.
        std::fill(last_seen.begin(), last_seen.end(), t);
        root_seen = t;
        if (t - last_loop > timeout_s / 2) may_replace = false;
      }
      last_loop = t;
      if (g_signal && !state_written()) {
        if (is_fault(g_signal)) fail_on_fault();
        rank == 0 ? cancel_as_root(0, "") : cancel_as_other();
      }
      if (t - last_beat >= interval) heartbeat(t), last_beat = t;
      rank == 0 ? root_check(t) : other_check(t);
    }
  }

  bool state_written() {
    std::lock_guard lock(state.mu);
    return state.written;
  }
};

Watchdog::Watchdog(double timeout_s, RunState& state)
    : impl_(std::make_unique<Impl>(timeout_s, state)) {
  impl_->thread = std::thread([this] { impl_->run(); });
}

Watchdog::~Watchdog() {
  impl_->stop = true;
  impl_->thread.join();
}

void Watchdog::attach(CommLedger* ledger) {
  std::lock_guard lock(impl_->ledger_mu);
  impl_->ledger = ledger;
}

}  // namespace strata
