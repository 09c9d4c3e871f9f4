// strata SDK: the exchanges a context-parallel model issues inside its attention, supplied by the
// strategy (Megatron-Core's context parallelism: cp_comm_type a2a, DeepSpeed-Ulysses, or p2p, ring
// attention).
//
// With Partition::cp_size > 1 a rank holds seq / cp tokens of each of its micro-batch's
// sequences (strata::cp_position's zig-zag chunks) and every per-token layer runs on them alone.
// Partition::cp_attention says how each block's attention sees the whole sequence:
// - ulysses: q | k | v exchanged with an all-to-all so that each rank holds every token of the
//   sequences on 1 / cp of its heads, the causal attention over whole sequences, the output
//   exchanged back (the backward: the same two trips for the gradients);
// - ring: each rank keeps its queries and passes its keys and values around the group (cp - 1
//   ring passes), attending its queries to each block as it arrives and merging the blocks'
//   outputs by their log-sum-exps (flash attention's online softmax); the backward passes the
//   keys and values again, each block's gradient travelling with it back to its owner (cp passes).
// A moe block also gathers every cp rank's routing counts per chunk of each sequence: its
// capacity and load-balancing loss are per whole sequence (all_gather).
// StageModel calls these on the compute thread. The ring pass is split in two so a comm stream
// can carry it while the compute thread attends the block in hand.
#pragma once
#include <functional>
#include <utility>

#include "strata/comm.hpp"
#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

class ContextParallelComm {
 public:
  virtual ~ContextParallelComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Group::all_to_all: block j of `in` (in.count / size() elements) to rank j, block i of `out`
  // from rank i.
  virtual void all_to_all(BufferView in, BufferView out) = 0;
  // Group::all_gather: every rank's `mine`, rank after rank (all.count == mine.count x size()).
  virtual void all_gather(BufferView mine, BufferView all) = 0;
  // Ring attention's pass: `send` to rank (rank() + 1) % size(), `recv` (as many elements) from
  // rank (rank() - 1 + size()) % size(). ring_start may return before the pass is done and
  // ring_wait() waits for it; neither buffer is touched in between.
  virtual void ring_start(BufferView send, BufferView recv) = 0;
  virtual void ring_wait() = 0;
};

// The default: each exchange on `group`, recorded by the ledger like any Group call; the
// all-to-all blocking on the calling thread, the ring pass (a send and a receive, in an order
// that cannot deadlock) on `stream` when one is given (overlapped with the caller's compute),
// else blocking too. `computed` (Context::compute_event) orders a pass after the compute that
// wrote its send buffer, on a GPU.
class SyncContextParallelComm final : public ContextParallelComm {
 public:
  explicit SyncContextParallelComm(Group& group, CommStream* stream = nullptr,
                                   std::function<Event()> computed = {})
      : group_(group), stream_(stream), computed_(std::move(computed)) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void all_to_all(BufferView in, BufferView out) override { group_.all_to_all(in, out); }
  void all_gather(BufferView mine, BufferView all) override { group_.all_gather(mine, all); }
  void ring_start(BufferView send, BufferView recv) override {
    if (!stream_) return pass(send, recv);
    pending_ = stream_->enqueue([this, send, recv] { pass(send, recv); },
                                computed_ ? computed_() : Event{});
  }
  void ring_wait() override {
    pending_.wait();
    pending_ = Event{};
  }

 private:
  // Even ranks send first, odd ranks receive first: every send meets a posted receive.
  void pass(BufferView send, BufferView recv) {
    const int next = (rank() + 1) % size(), prev = (rank() - 1 + size()) % size();
    if (rank() % 2 == 0) group_.send(send, next, kRingTag);
    group_.recv(recv, prev, kRingTag);
    if (rank() % 2 != 0) group_.send(send, next, kRingTag);
  }
  static constexpr int kRingTag = 7;
  Group& group_;
  CommStream* stream_;
  std::function<Event()> computed_;
  Event pending_;
};

}  // namespace strata
STRATA_EXPORT_END
