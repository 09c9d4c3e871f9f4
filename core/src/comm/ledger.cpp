// The comm ledger and the recording wrapper every Group call goes through.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "comm/host_copy.hpp"
#include "comm/idle_clock.hpp"
#include "comm/thread_role.hpp"
#include "run/profiler_ranges.hpp"
#include "strata/comm.hpp"
#include "strata/device.hpp"

namespace strata {

double now() {
  static const auto t_start = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
}

CommLedger::~CommLedger() { forget_idle_waits(this); }

thread_local bool t_on_comm_worker = false;
thread_local const std::string* t_stream_name = nullptr;
thread_local std::optional<std::pair<double, double>> t_device_interval;

void CommLedger::set_step(int step) {
  std::lock_guard lock(mu_);
  step_ = step;
}

int CommLedger::step() const {
  std::lock_guard lock(mu_);
  return step_;
}

int CommLedger::begin_call(CommOp op, const std::string& group, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  int token = next_token_++;
  in_flight_[token] = InFlight{op, group, bytes, now(), t_stream_name ? *t_stream_name : "compute"};
  return token;
}

void CommLedger::end_call(int token, int group_size) { end_call(token, group_size, -1.0, now()); }

void CommLedger::end_call(int token, int group_size, double t0, double t1) {
  std::lock_guard lock(mu_);
  auto it = in_flight_.find(token);
  if (it == in_flight_.end()) return;
  const InFlight& f = it->second;
  // The device's interval lies inside the host's call; a negative t0 means the host's.
  t0 = t0 < 0 ? f.t0 : std::clamp(t0, f.t0, t1);
  records_.push_back(CommRecord{f.op, f.group, group_size, f.bytes, t0, t1, step_, f.stream});
  in_flight_.erase(it);
}

void CommLedger::record_wait(double t0, double t1) {
  std::lock_guard lock(mu_);
  waits_.emplace_back(step_, t0, t1);
}

std::vector<CommRecord> CommLedger::records() const {
  std::lock_guard lock(mu_);
  return records_;
}

std::vector<std::pair<double, double>> CommLedger::waits(int step) const {
  std::lock_guard lock(mu_);
  std::vector<std::pair<double, double>> out;
  for (const auto& [s, t0, t1] : waits_)
    if (s == step) out.emplace_back(t0, t1);
  return out;
}

std::vector<InFlight> CommLedger::in_flight() const {
  std::lock_guard lock(mu_);
  std::vector<InFlight> out;
  for (const auto& [token, f] : in_flight_) out.push_back(f);
  return out;
}

void CommLedger::drain(std::vector<CommRecord>* records,
                       std::vector<std::pair<double, double>>* waits) {
  std::lock_guard lock(mu_);
  records->swap(records_);
  records_.clear();
  waits->clear();
  for (const auto& [s, t0, t1] : waits_) waits->emplace_back(t0, t1);
  waits_.clear();
}

void CommLedger::clear() {
  std::lock_guard lock(mu_);
  records_.clear();
  waits_.clear();
}

template <class F>
void Group::recorded(CommOp op, std::uint64_t bytes, F&& f) {
  const ProfilerRange range(op_name(op), name_);  // "all_reduce tp": the ledger's op and group
  int token = ledger_ ? ledger_->begin_call(op, name_, bytes) : -1;
  const bool compute_waits = ledger_ && !t_on_comm_worker;
  const WaitStart start = compute_waits ? begin_wait() : WaitStart{};
  t_device_interval.reset();
  try {
    f();
  } catch (...) {
    if (ledger_) ledger_->end_call(token, size_);  // not in flight any more: it failed
    throw;
  }
  if (ledger_) {
    if (t_device_interval)  // the transport timed the call on the device
      ledger_->end_call(token, size_, t_device_interval->first, t_device_interval->second);
    else
      ledger_->end_call(token, size_);
    // A blocking call on the compute thread leaves compute idle for its whole duration.
    if (compute_waits) end_wait(*ledger_, start);
  }
  t_device_interval.reset();
}

void recorded_host_copy(CommLedger& ledger, CommOp op, BufferView dst, BufferView src) {
  // The wait encloses the call: on the CPU all of the copy's time is exposed.
  const bool compute_waits = !t_on_comm_worker;
  const WaitStart start = compute_waits ? begin_wait() : WaitStart{};
  const ProfilerRange range(op_name(op), kHostGroupName);
  const int token = ledger.begin_call(op, kHostGroupName, dst.bytes());
  try {
    copy_across(dst, src);
  } catch (...) {
    ledger.end_call(token, 1);  // not in flight any more: it failed
    throw;
  }
  ledger.end_call(token, 1);
  if (compute_waits) end_wait(ledger, start);
}

static void require(bool ok, const std::string& what) {
  if (!ok) throw Error("collective argument mismatch: " + what, "this is a bug in the strategy");
}

// The checks and single-rank shortcuts every transport shares, once, before its do_* call: a peer
// or root inside the group; for a transport of host memory (mpi, ucx, gloo) nothing to move for an
// empty buffer or a group of one (a reduction of one rank is its input; reduce-scatter and
// all-gather copy into place). A transport of device memory (nccl) gets every call: it orders
// even a no-op on its stream. The call is recorded either way, so that the ledger's calls are
// the strategy's.
bool Group::trivial(BufferView b) const {
  return !moves_device_memory() && (b.count == 0 || size_ == 1);
}

void Group::check_rank(int r, const char* what) const {
  if (r < 0 || r >= size_)
    throw Error("group '" + name_ + "': " + what + " " + std::to_string(r) +
                    " is out of range (the group has " + std::to_string(size_) + " ranks)",
                "ranks are numbered within the group, 0 to size()-1");
}

void Group::all_reduce(BufferView b) {
  recorded(CommOp::all_reduce, b.bytes(), [&] {
    if (!trivial(b)) do_all_reduce(b, Reduction::sum);
  });
}
void Group::all_reduce_max(BufferView b) {
  recorded(CommOp::all_reduce, b.bytes(), [&] {
    if (!trivial(b)) do_all_reduce(b, Reduction::max);
  });
}
void Group::reduce_scatter(BufferView in, BufferView out) {
  require(in.count == out.count * std::size_t(size_) && in.dtype == out.dtype,
          "reduce_scatter needs in.count == out.count * group size on " + name_);
  recorded(CommOp::reduce_scatter, in.bytes(), [&] {
    if (!trivial(out)) return do_reduce_scatter(in, out);
    if (in.data != out.data && out.count > 0) std::memmove(out.data, in.data, out.bytes());
  });
}
void Group::all_gather(BufferView in, BufferView out) {
  require(out.count == in.count * std::size_t(size_) && in.dtype == out.dtype,
          "all_gather needs out.count == in.count * group size on " + name_);
  recorded(CommOp::all_gather, out.bytes(), [&] {
    if (!trivial(in)) return do_all_gather(in, out);
    if (out.data != in.data && in.count > 0) std::memmove(out.data, in.data, in.bytes());
  });
}
void Group::broadcast(BufferView b, int root) {
  check_rank(root, "broadcast root");
  recorded(CommOp::broadcast, b.bytes(), [&] {
    if (!trivial(b)) do_broadcast(b, root);
  });
}
void Group::reduce(BufferView b, int root) {
  check_rank(root, "reduce root");
  recorded(CommOp::reduce, b.bytes(), [&] {
    if (!trivial(b)) do_reduce(b, root);
  });
}
void Group::send(BufferView b, int peer, int tag) {
  check_rank(peer, "send peer");
  recorded(CommOp::send, b.bytes(), [&] { do_send(b, peer, tag); });
}
void Group::recv(BufferView b, int peer, int tag) {
  check_rank(peer, "recv peer");
  recorded(CommOp::recv, b.bytes(), [&] { do_recv(b, peer, tag); });
}
void Group::all_to_all(BufferView in, BufferView out) {
  const std::size_t n = std::size_t(size_);
  require(in.count == out.count && in.count % n == 0,
          "all_to_all needs in.count == out.count, a multiple of the group size, on " + name_);
  const std::vector<std::size_t> counts(n, in.count / n);
  all_to_allv(in, counts, out, counts);
}
void Group::all_to_allv(BufferView in, const std::vector<std::size_t>& send_counts, BufferView out,
                        const std::vector<std::size_t>& recv_counts) {
  const std::size_t n = std::size_t(size_);
  require(send_counts.size() == n && recv_counts.size() == n && in.dtype == out.dtype,
          "all_to_allv needs a send and a receive count per rank of " + name_ + " and one dtype");
  std::size_t sent = 0, received = 0;
  for (std::size_t c : send_counts) sent += c;
  for (std::size_t c : recv_counts) received += c;
  require(sent <= in.count && received <= out.count,
          "all_to_allv's counts exceed its buffers on " + name_);
  const auto* a = static_cast<const char*>(in.data);
  const auto* b = static_cast<const char*>(out.data);
  require(sent == 0 || received == 0 || a + in.bytes() <= b || b + out.bytes() <= a,
          "all_to_allv's input and output overlap on " + name_);
  require(send_counts[std::size_t(rank_)] == recv_counts[std::size_t(rank_)],
          "all_to_allv's block to itself must be its block from itself on " + name_);
  recorded(CommOp::all_to_all, sent * dtype_size(in.dtype), [&] {
    if (moves_device_memory() || size_ > 1) return do_all_to_all(in, send_counts, out, recv_counts);
    if (sent > 0) std::memcpy(out.data, in.data, sent * dtype_size(in.dtype));
  });
}
void Group::barrier() {
  recorded(CommOp::barrier, 0, [&] {
    if (size_ > 1 || moves_device_memory()) do_barrier();
  });
}

}  // namespace strata
