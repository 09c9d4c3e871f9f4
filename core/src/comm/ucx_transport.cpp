// The UCX transport: a Group whose collectives are built from UCP tagged point-to-point messages.
//
// Shape
//   One ucp_context per process (TAG feature), created with the first group and shared through a
//   std::shared_ptr, so it is cleaned up after the last group. Each group owns one ucp_worker in
//   UCS_THREAD_MODE_MULTI (comm-stream threads and the compute thread may send and receive on one
//   group at once, with different tags) and one endpoint per member, itself included. MPI is the
//   bootstrap: MPI_Comm_split of the world finds the members, MPI_Allgatherv exchanges the worker
//   addresses, and a barrier once the endpoints exist means nobody sends to a rank that cannot
//   receive yet. Every call blocks: it posts nonblocking UCP operations, then progresses the
//   group's worker until they complete.
//
// Tags (64 bits, always matched exactly)
//   bit 63       0: point to point, 1: collective
//   bits 24..55  p2p: the caller's tag; collective: the group's collective sequence number, one per
//                phase of a collective, so consecutive collectives never take each other's messages
//   bits 0..23   the sender's rank in the group
//   UCP matches messages of one tag from one sender in send order: the p2p contract and the
//   segmented algorithms below rely on that.
//
// Algorithms (n ranks, a buffer of B bytes; "small" is B < kSmallBytes, or kPairExchangeBytes when
// n = 2; env STRATA_UCX_SMALL_BYTES overrides both)
//   all_reduce      small or count < n: recursive doubling. With p the largest power of two <= n,
//                   the first 2(n-p) ranks pair up: the even one folds its data into the odd one
//                   before and receives the result after. Large: ring reduce-scatter + ring
//                   all-gather over n chunks (the first count % n chunks hold one element more).
//   reduce_scatter  ring. Each step's incoming chunk arrives in kSegmentBytes segments into two
//                   alternating buffers and is reduced segment by segment, so the reduction reads
//                   data that is still in cache while the next segment arrives.
//   all_gather      ring, each step received straight into the output.
//   broadcast       small: binomial tree; large: chain root -> root+1 -> ... in segments.
//   reduce          small: binomial tree; large: ring reduce-scatter, shards sent to the root.
//   barrier         dissemination: ceil(log2 n) rounds of 0-byte messages.
// Every rank gets bit-identical all_reduce results: the ring reduces each chunk once and gathers
// it; recursive doubling combines (lower rank's data, higher rank's data) on both partners.
#include "comm/ucx_transport.hpp"

#include <mpi.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <source_location>
#include <span>
#include <thread>
#include <vector>

#include "comm/reduce_kernels.hpp"

namespace strata::ucx {
namespace {

constexpr std::size_t kSmallBytes = 64 << 10;  // latency algorithms below this
// Two ranks: recursive doubling is one exchange of the whole buffer instead of the ring's two
// half-buffer rounds. Measured here with pinned ranks at 1-4 MiB: 3.6-4.9 GB/s busbw every run,
// where the ring swung between 2.4 and 6.3; the ring's segmented reduction is kept from 8 MiB.
constexpr std::size_t kPairExchangeBytes = 8 << 20;
constexpr std::size_t kSegmentBytes = 256 << 10;  // ring reduce and chain broadcast pipelining
constexpr unsigned kIdleSpinsBeforeYield = 32;    // oversubscribed ranks must let the peer run
constexpr double kCloseTimeoutSeconds = 10.0;
constexpr int kRankBits = 24;
constexpr std::uint64_t kCollectiveBit = std::uint64_t(1) << 63;
constexpr ucp_tag_t kExactMatch = ~ucp_tag_t(0);
constexpr const char* kHint =
    "check UCX_TLS / UCX_NET_DEVICES (ucx_info -d lists what this host has)";

int world_rank() {
  int initialized = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

[[noreturn]] void fail(const std::string& call, const char* file, unsigned line,
                       const std::string& why, const char* hint) {
  throw Error("rank " + std::to_string(world_rank()) + ": " + call + " failed at " + file + ":" +
                  std::to_string(line) + ": " + why,
              hint);
}

void check(ucs_status_t status, const char* call, const char* file, unsigned line) {
  if (status != UCS_OK) fail(call, file, line, ucs_status_string(status), kHint);
}

#define STRATA_UCX_CHECK(status, call) check((status), (call), __FILE__, __LINE__)

void check_mpi(int code, const char* call, const char* file, unsigned line) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  fail(call, file, line, std::string(text, len),
       "the UCX bootstrap is collective over MPI_COMM_WORLD: every rank must create the group");
}

#define STRATA_UCX_MPI_CHECK(call) check_mpi((call), #call, __FILE__, __LINE__)

// The process-wide UCP context.
class Context {
 public:
  Context() {
    ucp_config_t* config = nullptr;
    STRATA_UCX_CHECK(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_TAG;
    params.mt_workers_shared = 1;  // the workers of different groups run on different threads
    const ucs_status_t status = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    STRATA_UCX_CHECK(status, "ucp_init");
  }
  ~Context() { ucp_cleanup(context_); }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ucp_context_h get() const { return context_; }

 private:
  ucp_context_h context_ = nullptr;
};

std::shared_ptr<Context> shared_context() {
  static std::mutex mu;
  static std::weak_ptr<Context> current;
  std::lock_guard lock(mu);
  std::shared_ptr<Context> context = current.lock();
  if (!context) current = context = std::make_shared<Context>();
  return context;
}

// The all-reduce switch for a group of `ranks`: STRATA_UCX_SMALL_BYTES when set (for every size,
// so tests reach both paths), else kSmallBytes, or kPairExchangeBytes for two ranks.
std::size_t small_bytes_from_env(int ranks) {
  const char* env = std::getenv("STRATA_UCX_SMALL_BYTES");
  if (env == nullptr || *env == '\0') return ranks == 2 ? kPairExchangeBytes : kSmallBytes;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (*end != '\0')
    throw Error("STRATA_UCX_SMALL_BYTES='" + std::string(env) + "' is not a byte count",
                "unset it, or give the size below which the latency algorithms run, e.g. 65536");
  return std::size_t(v);
}

// A posted operation and the line that posted it (for the error message).
struct Pending {
  void* request;
  const char* call;
  std::source_location where;
};

class UcxGroup final : public Group {
 public:
  UcxGroup(std::string name, MPI_Comm comm, int rank, int size, CommLedger* ledger)
      : Group(std::move(name), rank, size, ledger),
        context_(shared_context()),
        small_bytes_(small_bytes_from_env(size)) {
    try {
      connect(comm);
    } catch (...) {
      release();
      throw;
    }
  }
  ~UcxGroup() override { release(); }
  UcxGroup(const UcxGroup&) = delete;
  UcxGroup& operator=(const UcxGroup&) = delete;

 protected:
  void do_all_reduce(BufferView b, Reduction r) override {
    const Op op = r == Reduction::sum ? Op::sum : Op::max;
    std::lock_guard lock(collective_mu_);
    if (b.bytes() < small_bytes_ || b.count < std::size_t(size()))
      return recursive_doubling(static_cast<char*>(b.data), b.count, b.dtype, op);
    const Chunks c{b.count, std::size_t(size()), dtype_size(b.dtype)};
    auto* buf = static_cast<char*>(b.data);
    ring_reduce_scatter(buf, buf, buf + c.offset(rank()), c, b.dtype, op);
    ring_all_gather(buf, c);
  }

  // In place when out is this rank's shard of in (out.data == in.data + rank * out.bytes()): the
  // ring reads in's chunk `rank` only in its last step, which writes that chunk's result.
  void do_reduce_scatter(BufferView in, BufferView out) override {
    std::lock_guard lock(collective_mu_);
    const Chunks c{in.count, std::size_t(size()), dtype_size(in.dtype)};
    ring_reduce_scatter(static_cast<const char*>(in.data), nullptr, static_cast<char*>(out.data), c,
                        in.dtype, Op::sum);
  }

  // In place when in is this rank's slot of out (in.data == out.data + rank * in.bytes()).
  void do_all_gather(BufferView in, BufferView out) override {
    char* slot = static_cast<char*>(out.data) + std::size_t(rank()) * in.bytes();
    std::lock_guard lock(collective_mu_);
    ring_all_gather(static_cast<char*>(out.data),
                    Chunks{out.count, std::size_t(size()), dtype_size(out.dtype)},
                    slot == in.data ? nullptr : static_cast<const char*>(in.data));
  }

  void do_broadcast(BufferView b, int root) override {
    std::lock_guard lock(collective_mu_);
    if (b.bytes() < small_bytes_)
      binomial_broadcast(static_cast<char*>(b.data), b.bytes(), root);
    else
      chain_broadcast(static_cast<char*>(b.data), b.bytes(), root);
  }

  // Sum into the root's buffer; the other ranks' buffers are left as they were (as MPI_Reduce).
  void do_reduce(BufferView b, int root) override {
    std::lock_guard lock(collective_mu_);
    auto* buf = static_cast<char*>(b.data);
    if (b.bytes() < small_bytes_ || b.count < std::size_t(size()))
      return binomial_reduce(buf, b.count, b.dtype, root);
    const Chunks c{b.count, std::size_t(size()), dtype_size(b.dtype)};
    const char* shard = ring_reduce_scatter(
        buf, nullptr, rank() == root ? buf + c.offset(rank()) : nullptr, c, b.dtype, Op::sum);
    const std::uint32_t seq = next_seq();
    if (rank() != root) return wait({send(shard, c.bytes(rank()), root, seq)});
    std::vector<Pending> recvs;
    for (int i = 0; i < size(); ++i)
      if (i != root) recvs.push_back(recv(buf + c.offset(i), c.bytes(i), i, seq));
    wait(recvs);
  }

  void do_send(BufferView b, int peer, int tag) override {
    wait({post_send(b.data, b.bytes(), peer, p2p_tag(tag, rank()))});
  }
  void do_recv(BufferView b, int peer, int tag) override {
    wait({post_recv(b.data, b.bytes(), p2p_tag(tag, peer))});
  }

  // Every block at once: a receive posted from each peer, then a send to each, peer r+1 first
  // (so that the ranks do not all send to rank 0 first); this rank's own block copied.
  void do_all_to_all(BufferView in, const std::vector<std::size_t>& send_counts, BufferView out,
                     const std::vector<std::size_t>& recv_counts) override {
    const std::size_t esize = dtype_size(in.dtype);
    std::vector<std::size_t> send_at(size(), 0), recv_at(size(), 0);
    for (int i = 1; i < size(); ++i) {
      send_at[i] = send_at[i - 1] + send_counts[i - 1] * esize;
      recv_at[i] = recv_at[i - 1] + recv_counts[i - 1] * esize;
    }
    const auto* src = static_cast<const char*>(in.data);
    auto* dst = static_cast<char*>(out.data);
    std::lock_guard lock(collective_mu_);
    const std::uint32_t seq = next_seq();
    std::vector<Pending> ops;
    for (int k = 1; k < size(); ++k) {
      const int peer = peer_at(-k);
      ops.push_back(recv(dst + recv_at[peer], recv_counts[peer] * esize, peer, seq));
    }
    for (int k = 1; k < size(); ++k) {
      const int peer = peer_at(k);
      ops.push_back(send(src + send_at[peer], send_counts[peer] * esize, peer, seq));
    }
    std::memcpy(dst + recv_at[rank()], src + send_at[rank()], send_counts[rank()] * esize);
    wait(ops);
  }

  void do_barrier() override {
    std::lock_guard lock(collective_mu_);
    const std::uint32_t seq = next_seq();
    char out = 0, in = 0;
    for (int k = 1; k < size(); k <<= 1)
      wait({recv(&in, 0, peer_at(-k), seq), send(&out, 0, peer_at(k), seq)});
  }

 private:
  // ---- Bootstrap and teardown

  void connect(MPI_Comm comm) {
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_MULTI;
    STRATA_UCX_CHECK(ucp_worker_create(context_->get(), &wp, &worker_), "ucp_worker_create");
    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE | UCP_WORKER_ATTR_FIELD_ADDRESS;
    STRATA_UCX_CHECK(ucp_worker_query(worker_, &attr), "ucp_worker_query");
    const std::string address(reinterpret_cast<const char*>(attr.address), attr.address_length);
    ucp_worker_release_address(worker_, attr.address);
    if (attr.thread_mode != UCS_THREAD_MODE_MULTI)
      throw Error("rank " + std::to_string(world_rank()) +
                      ": the UCX library gives no multi-threaded worker (thread mode " +
                      std::to_string(int(attr.thread_mode)) + ")",
                  "comm streams use a group from several threads: use a UCX built with "
                  "--enable-mt");

    const int n = size();
    int length = int(address.size());
    std::vector<int> lengths(n), displs(n);
    STRATA_UCX_MPI_CHECK(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm));
    int total = 0;
    for (int i = 0; i < n; ++i) displs[i] = total, total += lengths[i];
    std::string all(std::size_t(total), '\0');
    STRATA_UCX_MPI_CHECK(MPI_Allgatherv(address.data(), length, MPI_BYTE, all.data(),
                                        lengths.data(), displs.data(), MPI_BYTE, comm));
    eps_.assign(n, nullptr);
    for (int i = 0; i < n; ++i) {
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
      ep.address = reinterpret_cast<const ucp_address_t*>(all.data() + displs[i]);
      STRATA_UCX_CHECK(ucp_ep_create(worker_, &ep, &eps_[i]), "ucp_ep_create");
    }
    STRATA_UCX_MPI_CHECK(MPI_Barrier(comm));  // every member's endpoints exist from here on
  }

  // Close (flushing) every endpoint, then the worker. Bounded: a peer that has gone cannot hold the
  // process at exit.
  void release() noexcept {
    if (worker_ == nullptr) return;
    std::vector<void*> closing;
    for (ucp_ep_h ep : eps_) {
      if (ep == nullptr) continue;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = 0;  // flush, not UCP_EP_CLOSE_FLAG_FORCE
      void* request = ucp_ep_close_nbx(ep, &p);
      if (UCS_PTR_IS_PTR(request)) closing.push_back(request);
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(kCloseTimeoutSeconds);
    for (void* request : closing) {
      while (ucp_request_check_status(request) == UCS_INPROGRESS &&
             std::chrono::steady_clock::now() < deadline)
        ucp_worker_progress(worker_);
      ucp_request_free(request);
    }
    eps_.clear();
    ucp_worker_destroy(worker_);
    worker_ = nullptr;
  }

  // ---- Messages

  static std::uint64_t p2p_tag(int tag, int source) {
    return (std::uint64_t(std::uint32_t(tag)) << kRankBits) | std::uint64_t(source);
  }
  static std::uint64_t collective_tag(std::uint32_t seq, int source) {
    return kCollectiveBit | (std::uint64_t(seq) << kRankBits) | std::uint64_t(source);
  }
  std::uint32_t next_seq() { return seq_.fetch_add(1, std::memory_order_relaxed); }
  int peer_at(int distance) const { return ((rank() + distance) % size() + size()) % size(); }

  static ucp_request_param_t host_bytes() {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.datatype = ucp_dt_make_contig(1);
    p.memory_type = UCS_MEMORY_TYPE_HOST;  // CPU buffers: spares UCX the memory type lookup
    return p;
  }
  Pending post_send(const void* data, std::size_t bytes, int peer, std::uint64_t tag,
                    std::source_location where = std::source_location::current()) {
    const ucp_request_param_t p = host_bytes();
    return {ucp_tag_send_nbx(eps_[peer], data, bytes, tag, &p), "ucp_tag_send_nbx", where};
  }
  Pending post_recv(void* data, std::size_t bytes, std::uint64_t tag,
                    std::source_location where = std::source_location::current()) {
    const ucp_request_param_t p = host_bytes();
    return {ucp_tag_recv_nbx(worker_, data, bytes, tag, kExactMatch, &p), "ucp_tag_recv_nbx",
            where};
  }
  // Collective messages of phase `seq`.
  Pending send(const void* data, std::size_t bytes, int peer, std::uint32_t seq,
               std::source_location where = std::source_location::current()) {
    return post_send(data, bytes, peer, collective_tag(seq, rank()), where);
  }
  Pending recv(void* data, std::size_t bytes, int peer, std::uint32_t seq,
               std::source_location where = std::source_location::current()) {
    return post_recv(data, bytes, collective_tag(seq, peer), where);
  }

  ucs_status_t complete(void* request) {
    if (request == nullptr) return UCS_OK;  // completed when posted
    if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
    ucs_status_t status;
    unsigned idle = 0;
    while ((status = ucp_request_check_status(request)) == UCS_INPROGRESS) {
      if (ucp_worker_progress(worker_) != 0)
        idle = 0;
      else if (++idle == kIdleSpinsBeforeYield)
        idle = 0, std::this_thread::yield();
    }
    ucp_request_free(request);
    return status;
  }

  // Completes every operation before reporting the first failure: a receive left posted could
  // still write into a buffer the caller is about to free.
  void wait(std::span<const Pending> ops) {
    const Pending* failed = nullptr;
    ucs_status_t first = UCS_OK;
    for (const Pending& op : ops) {
      const ucs_status_t status = complete(op.request);
      if (status != UCS_OK && failed == nullptr) failed = &op, first = status;
    }
    if (failed) check(first, failed->call, failed->where.file_name(), failed->where.line());
  }
  void wait(std::initializer_list<Pending> ops) { wait(std::span(ops.begin(), ops.size())); }

  // Regions of the group's scratch buffer, each 64-byte aligned. Grown, never shrunk: big
  // collectives repeat, and fresh pages would cost a fault per 4 KiB every call.
  std::vector<char*> scratch(std::initializer_list<std::size_t> sizes) {
    std::size_t total = 0;
    for (std::size_t s : sizes) total += (s + 63) / 64 * 64;
    if (total + 64 > scratch_bytes_) {
      scratch_.reset(new char[total + 64]);
      scratch_bytes_ = total + 64;
    }
    char* p = scratch_.get() + (64 - reinterpret_cast<std::uintptr_t>(scratch_.get()) % 64) % 64;
    std::vector<char*> out;
    for (std::size_t s : sizes) out.push_back(p), p += (s + 63) / 64 * 64;
    return out;
  }

  // ---- Collectives

  // Ring reduce-scatter: after n-1 steps rank r holds chunk r of the reduction of every rank's
  // `in`. Step s sends the partial of chunk r-s-1 right and reduces chunk r-s-2 from the left into
  // `inplace` (all_reduce: in == inplace) or into two alternating scratch chunks (so the chunk
  // being sent is never the one being written). The last step writes `final_dst`; given nullptr,
  // the result stays in scratch. Returns where the result is.
  const char* ring_reduce_scatter(const char* in, char* inplace, char* final_dst, const Chunks& c,
                                  DType t, Op op) {
    const int n = size(), left = peer_at(-1), right = peer_at(1);
    const std::uint32_t seq = next_seq();
    const std::size_t seg = kSegmentBytes / c.esize * c.esize;
    const std::size_t rbuf_bytes = std::min(seg, c.max_bytes());
    const std::size_t work_bytes = inplace ? 0 : c.max_bytes();
    const auto s = scratch({rbuf_bytes, rbuf_bytes, work_bytes, work_bytes});
    char* const rbuf[2] = {s[0], s[1]};
    char* const work[2] = {s[2], s[3]};

    const char* cur = in + c.offset(peer_at(-1));
    std::size_t cur_bytes = c.bytes(peer_at(-1));
    std::vector<Pending> sends;
    for (int step = 0; step < n - 1; ++step) {
      const int ri = peer_at(-step - 2);
      const std::size_t bytes = c.bytes(ri);
      char* dst = step == n - 2 ? (final_dst ? final_dst : work[step % 2])
                  : inplace     ? inplace + c.offset(ri)
                                : work[step % 2];
      sends.clear();
      for (std::size_t off = 0; off < cur_bytes; off += seg)
        sends.push_back(send(cur + off, std::min(seg, cur_bytes - off), right, seq));
      const std::size_t nseg = (bytes + seg - 1) / seg;
      Pending recvs[2] = {};
      for (std::size_t k = 0; k < std::min<std::size_t>(2, nseg); ++k)
        recvs[k] = recv(rbuf[k], std::min(seg, bytes - k * seg), left, seq);
      for (std::size_t k = 0; k < nseg; ++k) {
        const std::size_t off = k * seg, len = std::min(seg, bytes - off);
        wait({recvs[k % 2]});
        combine(dst + off, in + c.offset(ri) + off, rbuf[k % 2], len / c.esize, t, op);
        if (k + 2 < nseg)
          recvs[k % 2] = recv(rbuf[k % 2], std::min(seg, bytes - (k + 2) * seg), left, seq);
      }
      wait(sends);
      cur = dst;
      cur_bytes = bytes;
    }
    return cur;
  }

  // Ring all-gather: step s forwards chunk r-s right and receives chunk r-s-1 from the left. Rank
  // r's chunk r is in buf already or, given `own`, outside it: then the first step sends it from
  // there and copies it into its slot while the transfer runs (no send waits for that copy).
  void ring_all_gather(char* buf, const Chunks& c, const char* own = nullptr) {
    const int left = peer_at(-1), right = peer_at(1);
    const std::uint32_t seq = next_seq();
    for (int step = 0; step < size() - 1; ++step) {
      const int si = peer_at(-step), ri = peer_at(-step - 1);
      const char* from = step == 0 && own ? own : buf + c.offset(si);
      const Pending ops[] = {recv(buf + c.offset(ri), c.bytes(ri), left, seq),
                             send(from, c.bytes(si), right, seq)};
      if (step == 0 && own) std::memcpy(buf + c.offset(si), own, c.bytes(si));
      wait(ops);
    }
  }

  void recursive_doubling(char* buf, std::size_t count, DType t, Op op) {
    const int n = size(), me = rank();
    const std::size_t bytes = count * dtype_size(t);
    const std::uint32_t seq = next_seq();
    char* tmp = scratch({bytes})[0];
    int p = 1;
    while (p * 2 <= n) p *= 2;
    const int extra = n - p;  // ranks 0 .. 2*extra-1 pair up (even, odd); the even one sits out
    if (me < 2 * extra && me % 2 == 0) {
      wait({send(buf, bytes, me + 1, seq)});
      wait({recv(buf, bytes, me + 1, seq)});
      return;
    }
    if (me < 2 * extra) {
      wait({recv(tmp, bytes, me - 1, seq)});
      combine(buf, tmp, buf, count, t, op);  // lower rank's data first
    }
    const int vme = me < 2 * extra ? me / 2 : me - extra;
    for (int mask = 1; mask < p; mask <<= 1) {
      const int vpeer = vme ^ mask;
      const int peer = vpeer < extra ? vpeer * 2 + 1 : vpeer + extra;
      wait({recv(tmp, bytes, peer, seq), send(buf, bytes, peer, seq)});
      if (peer < me)
        combine(buf, tmp, buf, count, t, op);
      else
        combine(buf, buf, tmp, count, t, op);
    }
    if (me < 2 * extra) wait({send(buf, bytes, me - 1, seq)});
  }

  // Binomial tree over ranks relative to the root: receive from the parent, then send to the
  // children, farthest subtree first.
  void binomial_broadcast(char* buf, std::size_t bytes, int root) {
    const int n = size(), vme = (rank() - root + n) % n;
    const std::uint32_t seq = next_seq();
    int mask = 1;
    for (; mask < n; mask <<= 1)
      if (vme & mask) {
        wait({recv(buf, bytes, (vme - mask + root) % n, seq)});
        break;
      }
    std::vector<Pending> sends;
    for (mask >>= 1; mask > 0; mask >>= 1)
      if (vme + mask < n) sends.push_back(send(buf, bytes, (vme + mask + root) % n, seq));
    wait(sends);
  }

  // A chain root -> root+1 -> ...: each rank forwards a segment as soon as it has it, so every link
  // of the chain carries the whole buffer at once, with a latency of (n-1) segments.
  void chain_broadcast(char* buf, std::size_t bytes, int root) {
    const int vme = (rank() - root + size()) % size();
    const std::uint32_t seq = next_seq();
    std::vector<Pending> sends;
    for (std::size_t off = 0; off < bytes; off += kSegmentBytes) {
      const std::size_t len = std::min(kSegmentBytes, bytes - off);
      if (vme > 0) wait({recv(buf + off, len, peer_at(-1), seq)});
      if (vme < size() - 1) sends.push_back(send(buf + off, len, peer_at(1), seq));
    }
    wait(sends);
  }

  // Binomial tree to the root: a rank adds its children's partial sums (nearest first), then sends
  // its own to its parent. A non-root rank accumulates in scratch: its buffer stays as it was.
  void binomial_reduce(char* buf, std::size_t count, DType t, int root) {
    const int n = size(), vme = (rank() - root + n) % n;
    const std::size_t bytes = count * dtype_size(t);
    const std::uint32_t seq = next_seq();
    const auto s = scratch({bytes, rank() == root ? 0 : bytes});
    char* const tmp = s[0];
    char* const acc = rank() == root ? buf : s[1];
    const char* partial = buf;
    for (int mask = 1; mask < n; mask <<= 1) {
      if (vme & mask) return wait({send(partial, bytes, (vme - mask + root) % n, seq)});
      if (vme + mask < n) {
        wait({recv(tmp, bytes, (vme + mask + root) % n, seq)});
        combine(acc, partial, tmp, count, t, Op::sum);
        partial = acc;
      }
    }
  }

  std::shared_ptr<Context> context_;  // outlives the worker: released after it (declared first)
  ucp_worker_h worker_ = nullptr;
  std::vector<ucp_ep_h> eps_;
  const std::size_t small_bytes_;
  std::atomic<std::uint32_t> seq_{0};
  // Collectives of one group run one at a time (their order must match across ranks anyway); the
  // lock also owns the scratch buffer. Point to point takes no lock.
  std::mutex collective_mu_;
  std::unique_ptr<char[]> scratch_;
  std::size_t scratch_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Group> split(const std::string& name, int color, int key, CommLedger* ledger) {
  MPI_Comm comm = MPI_COMM_NULL;
  STRATA_UCX_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm));
  // The communicator only bootstraps the group: freed when the endpoints exist (or on failure).
  struct Free {
    MPI_Comm* comm;
    ~Free() { MPI_Comm_free(comm); }
  } free_comm{&comm};
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  STRATA_UCX_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  STRATA_UCX_MPI_CHECK(MPI_Comm_size(comm, &size));
  if (size >= (1 << kRankBits))
    throw Error("a ucx group of " + std::to_string(size) + " ranks is more than the tag holds",
                "use the mpi transport for groups of 2^24 ranks or more");
  return std::make_unique<UcxGroup>(name, comm, rank, size, ledger);
}

std::string library_version() { return std::string("UCX ") + ucp_get_version_string(); }

}  // namespace strata::ucx
