// strata SDK: communication. One Group interface over every transport (mpi today; ucx, nccl later),
// a ledger that records every call, and comm streams with events so a plugin overlaps
// communication with compute the same way on every device.
#pragma once
#include <array>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "strata/export.hpp"
#include "strata/types.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

enum class CommOp : int {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  reduce,
  send,
  recv,
  barrier,
  // Copies between the run's device and host memory (CPU offload), recorded like collectives on
  // the pseudo-group "host" of size 1 (bus factor 1): device to host, host to device. Appended:
  // run files name their ops, so older files keep theirs.
  d2h,
  h2d,
  // The personalised exchange (Group::all_to_all and all_to_allv: a block to each rank).
  all_to_all
};
inline constexpr int kNumCommOps = 11;
inline constexpr std::array<const char*, kNumCommOps> kCommOpNames = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce",    "send",
    "recv",       "barrier",        "d2h",        "h2d",       "all_to_all"};
inline const char* op_name(CommOp op) { return kCommOpNames[static_cast<int>(op)]; }

// nccl-tests bus-bandwidth factor: busbw = algbw * factor, so numbers compare across world sizes.
inline double bus_factor(CommOp op, int n) {
  switch (op) {
    case CommOp::all_reduce:
      return n > 1 ? 2.0 * (n - 1) / n : 0.0;
    case CommOp::reduce_scatter:
    case CommOp::all_gather:
    case CommOp::all_to_all:
      return n > 1 ? double(n - 1) / n : 0.0;
    default:
      return 1.0;
  }
}

// One finished collective or point-to-point call. `bytes` follows the nccl-tests size convention:
// the buffer size for all_reduce/broadcast/reduce/send/recv, the full (n x shard) size for
// all_gather and reduce_scatter, the rank's whole send buffer (its blocks for every rank, its own
// included) for all_to_all; d2h/h2d: the bytes copied.
struct CommRecord {
  CommOp op;
  std::string group;
  int group_size;
  std::uint64_t bytes;
  double t0, t1;                   // seconds on the process clock (strata::now())
  int step;                        // the training step it belongs to (-1: outside any step)
  std::string stream = "compute";  // the thread that ran it: "compute" or a comm stream's name
  double seconds() const { return t1 - t0; }
  double algbw() const { return t1 > t0 ? bytes / (t1 - t0) : 0.0; }  // bytes/s
  double busbw() const { return algbw() * bus_factor(op, group_size); }
};

// A call that is in flight, for the watchdog.
struct InFlight {
  CommOp op;
  std::string group;
  std::uint64_t bytes;
  double t0;
  std::string stream;
};

// Seconds since process start on a monotonic clock. All intervals in strata use it.
double now();

// The comm ledger of one rank: every call, every interval the compute thread spent waiting.
// Thread-safe: comm streams record from their worker threads.
class CommLedger {
 public:
  CommLedger() = default;
  // Drops the compute-idle intervals still waiting for a device's timing (a wait on a GPU is
  // resolved after the step's synchronisation), which would otherwise be recorded into it later.
  ~CommLedger();
  CommLedger(const CommLedger&) = delete;
  CommLedger& operator=(const CommLedger&) = delete;

  void set_step(int step);
  int step() const;

  int begin_call(CommOp op, const std::string& group, std::uint64_t bytes);  // returns a token
  void end_call(int token, int group_size);
  // Ends a call with the busy interval its transport timed on the device (inside the host's call).
  void end_call(int token, int group_size, double t0, double t1);
  // The compute thread was idle (blocked on an event or in a blocking call) over [t0, t1).
  void record_wait(double t0, double t1);

  std::vector<CommRecord> records() const;                       // all finished calls
  std::vector<std::pair<double, double>> waits(int step) const;  // compute idle intervals
  std::vector<InFlight> in_flight() const;
  // Move out every finished call and every recorded wait (the trainer takes them once per step).
  void drain(std::vector<CommRecord>* records, std::vector<std::pair<double, double>>* waits);
  void clear();

 private:
  mutable std::mutex mu_;
  int step_ = -1;
  int next_token_ = 0;
  std::map<int, InFlight> in_flight_;
  std::vector<CommRecord> records_;
  std::vector<std::tuple<int, double, double>> waits_;
};

// A communicator over a fixed set of ranks (one mesh axis). The public calls check their arguments
// (sizes, dtypes, a root or peer inside the group), record into the ledger and forward to the
// transport's do_* implementation; a transport of host memory is not called for an empty buffer
// or a group of one. All calls are blocking for the calling thread; put them on a CommStream to
// overlap them with compute.
class Group {
 public:
  Group(std::string name, int rank, int size, CommLedger* ledger)
      : name_(std::move(name)), rank_(rank), size_(size), ledger_(ledger) {}
  virtual ~Group() = default;
  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  void all_reduce(BufferView buf);                     // sum, in place
  void all_reduce_max(BufferView buf);                 // max, in place (not a bandwidth op)
  void reduce_scatter(BufferView in, BufferView out);  // in.count == out.count * size(), sum
  void all_gather(BufferView in, BufferView out);      // out.count == in.count * size()
  void broadcast(BufferView buf, int root);
  void reduce(BufferView buf, int root);  // sum into root's buf, in place
  // Point to point. `tag` keeps message streams between the same two ranks apart (e.g. pipeline
  // activations and gradients); messages of one tag arrive in the order they were sent.
  void send(BufferView buf, int peer, int tag = 0);
  void recv(BufferView buf, int peer, int tag = 0);
  void barrier();
  // The personalised exchange: block j of `in` goes to rank j, block i of `out` comes from rank i
  // (expert parallelism's token dispatch and combine, Ulysses' sequence <-> head resharding).
  // all_to_all: equal blocks (in.count == out.count, a multiple of size()). all_to_allv: blocks of
  // any size, packed in rank order: send_counts[j] elements of `in` to rank j, recv_counts[i] of
  // `out` from rank i, which must be what rank i sends here (exchange the counts first, e.g. with
  // all_to_all). `in` and `out` must not overlap. Recorded as all_to_all with the rank's send
  // bytes.
  void all_to_all(BufferView in, BufferView out);
  void all_to_allv(BufferView in, const std::vector<std::size_t>& send_counts, BufferView out,
                   const std::vector<std::size_t>& recv_counts);

 protected:
  enum class Reduction { sum, max };
  virtual void do_all_reduce(BufferView buf, Reduction r) = 0;
  virtual void do_reduce_scatter(BufferView in, BufferView out) = 0;
  virtual void do_all_gather(BufferView in, BufferView out) = 0;
  virtual void do_broadcast(BufferView buf, int root) = 0;
  virtual void do_reduce(BufferView buf, int root) = 0;
  virtual void do_send(BufferView buf, int peer, int tag) = 0;
  virtual void do_recv(BufferView buf, int peer, int tag) = 0;
  virtual void do_barrier() = 0;
  // Counts checked (one per rank, within the buffers); a host transport's group of one is a copy
  // and never gets here.
  virtual void do_all_to_all(BufferView in, const std::vector<std::size_t>& send_counts,
                             BufferView out, const std::vector<std::size_t>& recv_counts) = 0;
  // True for a transport that moves device memory (nccl): it gets every call, even those with
  // nothing to move, since it orders them on its stream.
  virtual bool moves_device_memory() const { return false; }

 private:
  template <class F>
  void recorded(CommOp op, std::uint64_t bytes, F&& f);
  void check_rank(int r, const char* what) const;
  bool trivial(BufferView b) const;  // nothing for the transport to do (a host transport's)
  std::string name_;
  int rank_, size_;
  CommLedger* ledger_;
};

// Completion of work enqueued on a stream. wait() blocks the caller (recording the idle time in the
// ledger when called from the compute thread) and rethrows an error raised by the work.
class Event {
 public:
  Event() = default;
  void wait() const;
  bool done() const;

 private:
  friend class CommStream;
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };
  std::shared_ptr<State> state_;
  CommLedger* ledger_ = nullptr;
};

// An ordered queue of communication work. On the CPU it is a worker thread; work runs in
// enqueue order, so every rank issues its collectives in the same order.
class CommStream {
 public:
  explicit CommStream(CommLedger& ledger, std::string name = "comm");
  ~CommStream();
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  Event enqueue(std::function<void()> work);
  // `work` starts only once `after` is done (an event of another stream, or
  // Context::compute_event(): the data it reads is computed), without blocking the caller: the
  // stream waits, not the compute thread (on a GPU, cudaStreamWaitEvent). An error of `after`
  // becomes this work's error. A default Event is done: no wait.
  Event enqueue(std::function<void()> work, const Event& after);
  void synchronize();  // wait for everything enqueued so far

  // Conveniences: the collective, enqueued after `after`.
  Event all_reduce(Group& g, BufferView buf, const Event& after = {}) {
    return enqueue([&g, buf] { g.all_reduce(buf); }, after);
  }
  Event reduce_scatter(Group& g, BufferView in, BufferView out, const Event& after = {}) {
    return enqueue([&g, in, out] { g.reduce_scatter(in, out); }, after);
  }
  Event all_gather(Group& g, BufferView in, BufferView out, const Event& after = {}) {
    return enqueue([&g, in, out] { g.all_gather(in, out); }, after);
  }

 private:
  void run();
  CommLedger& ledger_;
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::function<void()>, std::shared_ptr<Event::State>>> queue_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace strata
STRATA_EXPORT_END
