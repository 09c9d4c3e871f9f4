// The watchdog thread of every rank. It ends the job when a collective has been in flight longer
// than --watchdog (naming the rank, the op and the group), and on rank 0 it receives the errors of
// other ranks so the run file records them before the job is ended.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "comm/mpi_transport.hpp"
#include "trainer.hpp"

namespace strata {

struct Watchdog::Impl {
  double timeout_s;
  RunState& state;
  // Held while the ledger is read, so that attach(nullptr) returns only once the watchdog has let
  // go of it: train() detaches and then destroys its ledger (also when it unwinds on an error).
  std::mutex ledger_mu;
  CommLedger* ledger = nullptr;
  std::atomic<bool> stop{false};
  std::thread thread;

  void fail(const std::string& status, const std::string& message) {
    std::fprintf(stderr, "runner: error: %s\n", message.c_str());
    if (mpi::world_rank() == 0) {
      write_failure(state, status, message);
      mpi::abort_job(1);
    }
    mpi::send_error_to_root(status + "|" + message);
    std::this_thread::sleep_for(std::chrono::seconds(5));  // let rank 0 write the run file
    mpi::abort_job(1);
  }

  void run() {
    const int rank = mpi::world_rank();
    while (!stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::string message;
      if (rank == 0 && mpi::poll_error(&message)) {
        auto bar = message.find('|');
        std::string status = bar == std::string::npos ? "failed" : message.substr(0, bar);
        std::string text = bar == std::string::npos ? message : message.substr(bar + 1);
        std::fprintf(stderr, "runner: error: %s\n", text.c_str());
        write_failure(state, status, text);
        mpi::abort_job(1);
      }
      std::vector<InFlight> in_flight;
      {
        std::lock_guard lock(ledger_mu);
        if (ledger) in_flight = ledger->in_flight();
      }
      for (const InFlight& f : in_flight)
        if (now() - f.t0 > timeout_s) {
          char buf[256];
          std::snprintf(buf, sizeof buf,
                        "rank %d: %s on group %s (%llu bytes) has not finished after %.0f s "
                        "(--watchdog)",
                        rank, op_name(f.op), f.group.c_str(), (unsigned long long)f.bytes,
                        now() - f.t0);
          fail("timeout", buf);
        }
    }
  }
};

Watchdog::Watchdog(double timeout_s, RunState& state)
    : impl_(new Impl{timeout_s, state, {}, nullptr, {}, {}}) {
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
