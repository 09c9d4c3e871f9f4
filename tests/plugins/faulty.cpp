// Test-only plugin: a data-parallel strategy that fails on purpose, to test that a failure on any
// rank ends the whole job and still leaves a run file that says why.
//   mode=throw  rank R throws at step S           -> status failed
//   mode=oom    rank R cannot allocate (a real allocation of more than the address space can hold)
//               -> status oom
//   mode=hang   rank R skips a collective at step S -> the others wait; the watchdog ends the job
//   mode=threads rank R cannot start a thread (a real std::thread whose stack the address-space
//               limit, lowered for the attempt, refuses: std::system_error) -> status oom
//   at=setup    fail in setup instead (before the first step; mode throw or oom)
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <new>
#include <optional>
#include <thread>

#include "strata/data_parallel.hpp"

namespace {

using namespace strata;

class Faulty final : public Strategy {
 public:
  explicit Faulty(const Options& o)
      : mode_(o.get("mode")),
        at_(o.get("at")),
        rank_(int(o.get_int("rank"))),
        step_(int(o.get_int("step"))) {}
  void setup(Context& ctx) override {
    if (at_ == "setup" && ctx.coord().rank == rank_) fail(ctx, "setup");
    replica_.emplace(ctx);
  }
  void train_step(Context& ctx, int step) override {
    Replica& r = *replica_;
    forward_backward(ctx, r.param_ptrs(), r.grad_ptrs(), ctx.micro_batch(step, 0));
    bool me = at_ == "step" && ctx.coord().rank == rank_ && step == step_;
    if (me && mode_ == "hang") return;  // the others block in the all-reduce below
    if (me) fail(ctx, "step " + std::to_string(step));
    ctx.group(Axis::dp).all_reduce(r.grads());
  }

 private:
  void fail(Context& ctx, const std::string& where) {
    if (mode_ == "throw") throw Error("faulty plugin: failing on purpose at " + where);
    if (mode_ == "oom") {  // an allocation the ledger is asked for and the system refuses
      Buffer<float> huge(ctx.memory(), MemTag::workspace, std::size_t(1) << 60);
    }
    if (mode_ == "threads") start_thread_without_room();
  }
  // What ulimit -v or -u does to a rank that starts a thread: std::thread throws system_error.
  static void start_thread_without_room() {
    std::ifstream statm("/proc/self/statm");
    std::size_t pages = 0;
    statm >> pages;
    rlimit before{};
    ::getrlimit(RLIMIT_AS, &before);
    rlimit tight = before;
    tight.rlim_cur = pages * std::size_t(::sysconf(_SC_PAGESIZE)) + (1u << 20);  // no 8 MiB stack
    ::setrlimit(RLIMIT_AS, &tight);
    try {
      std::thread([] {}).join();
    } catch (...) {
      ::setrlimit(RLIMIT_AS, &before);
      throw;
    }
    ::setrlimit(RLIMIT_AS, &before);
  }
  std::string mode_, at_;
  int rank_, step_;
  std::optional<Replica> replica_;
};

const PluginDescriptor& descriptor() {
  static const PluginDescriptor d{
      kPluginAbiVersion,
      "testing",
      "test-only strategies",
      {{"faulty",
        "fails on purpose (tests)",
        {{"mode", OptionType::choice, "throw", "how to fail", {"throw", "oom", "hang", "threads"}},
         {"at", OptionType::choice, "step", "when to fail", {"setup", "step"}},
         {"rank", OptionType::integer, "0", "which rank fails", {}},
         {"step", OptionType::integer, "1", "at which step", {}}}}}};
  return d;
}

std::unique_ptr<Strategy> create(const std::string&, const Options& o) {
  return std::make_unique<Faulty>(o);
}

}  // namespace

STRATA_PLUGIN(descriptor, create)
