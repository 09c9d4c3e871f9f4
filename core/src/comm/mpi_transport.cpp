// MPI backend of the Comm interface.
#include "comm/mpi_transport.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "comm/job_end_note.hpp"

namespace strata::mpi {
namespace {

MPI_Comm g_control = MPI_COMM_NULL;  // harness traffic
MPI_Comm g_notices = MPI_COMM_NULL;  // watchdog notices: errors, heartbeats, cancellation

// Control-plane calls in flight, for the watchdog.
std::mutex g_calls_mu;
std::map<int, InFlight> g_calls;
int g_next_call = 0;

class ControlCall {
 public:
  ControlCall(CommOp op, std::uint64_t bytes) {
    std::lock_guard lock(g_calls_mu);
    token_ = g_next_call++;
    g_calls[token_] = InFlight{op, "control", bytes, now(), "compute"};
  }
  ~ControlCall() {
    std::lock_guard lock(g_calls_mu);
    g_calls.erase(token_);
  }
  ControlCall(const ControlCall&) = delete;
  ControlCall& operator=(const ControlCall&) = delete;

 private:
  int token_;
};

// Notices in flight: each send owns its buffer until MPI is done with it.
struct PendingNotice {
  MPI_Request request;
  int to;
  std::unique_ptr<std::string> payload;
};
std::mutex g_notices_mu;
std::vector<PendingNotice> g_pending;
constexpr int kMaxPendingPerPeer = 8;

std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, len);
}

void check(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  throw Error("rank " + std::to_string(rank) + ": " + call + " failed at " + file + ":" +
                  std::to_string(line) + ": " + error_string(code),
              "check that every rank runs the same configuration and the launcher's MPI matches "
              "the one strata was built with");
}

#define STRATA_MPI_CHECK(call) check((call), #call, __FILE__, __LINE__)

MPI_Datatype to_mpi(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
    case DType::bf16:
      return MPI_UINT16_T;  // MPI has no bfloat16: moved as 16-bit words, reduced by bf16_op()
  }
  return MPI_BYTE;
}

// bf16 reductions as MPI user operations on MPI_UINT16_T words (types.hpp's arithmetic).
extern "C" void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = to_bf16(to_float(a[i]) + to_float(b[i]));
}
extern "C" void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i)
    if (to_float(b[i]) < to_float(a[i])) b[i] = a[i];
}

// The MPI operation for a reduction of `t`: MPI's own, or the bf16 user operations (created on
// first use, commutative; MPI_Finalize frees them).
MPI_Op mpi_op(DType t, bool max) {
  if (t != DType::bf16) return max ? MPI_MAX : MPI_SUM;
  static MPI_Op sum = MPI_OP_NULL, maximum = MPI_OP_NULL;
  static std::once_flag once;
  std::call_once(once, [] {
    STRATA_MPI_CHECK(MPI_Op_create(bf16_sum, 1, &sum));
    STRATA_MPI_CHECK(MPI_Op_create(bf16_max, 1, &maximum));
  });
  return max ? maximum : sum;
}

int as_int(std::size_t count) {
  if (count > std::size_t(INT_MAX))
    throw Error("a single MPI call of " + std::to_string(count) + " elements exceeds INT_MAX",
                "use smaller buckets (e.g. --plugin-opt bucket_mb=...)");
  return int(count);
}

// Waits for a point-to-point request, polling MPI and yielding the core between polls. A blocking
// MPI_Send spins inside the library while its receiver is busy elsewhere (a pipeline stage's
// next pass): on ranks that fill the cores it took them from the compute threads (interleaved,
// small model, 2 ranks: 392 -> 340 ms a step). With nothing else to run, yield returns at once.
// The collectives stay blocking: Open MPI's nonblocking ones (libnbc) measured 1.5-2x slower
// here (all_reduce 4.7 -> 2.2 GB/s), which cost ddp more than the freed core gave back.
void yield_until_done(MPI_Request& request) {
  for (int done = 0;;) {
    STRATA_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::yield();
  }
}

class MpiGroup final : public Group {
 public:
  MpiGroup(std::string name, MPI_Comm comm, CommLedger* ledger)
      : Group(std::move(name), rank_of(comm), size_of(comm), ledger), comm_(comm) {}
  ~MpiGroup() override {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

 protected:
  void do_all_reduce(BufferView b, Reduction r) override {
    STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, b.data, as_int(b.count), to_mpi(b.dtype),
                                   mpi_op(b.dtype, r == Reduction::max), comm_));
  }
  void do_reduce_scatter(BufferView in, BufferView out) override {
    STRATA_MPI_CHECK(MPI_Reduce_scatter_block(in.data, out.data, as_int(out.count),
                                              to_mpi(in.dtype), mpi_op(in.dtype, false), comm_));
  }
  void do_all_gather(BufferView in, BufferView out) override {
    // In place when this rank's input already sits at its slot of the output (ZeRO's layout).
    const void* send = static_cast<char*>(out.data) + std::size_t(rank()) * in.bytes() == in.data
                           ? MPI_IN_PLACE
                           : in.data;
    STRATA_MPI_CHECK(MPI_Allgather(send, as_int(in.count), to_mpi(in.dtype), out.data,
                                   as_int(in.count), to_mpi(out.dtype), comm_));
  }
  void do_broadcast(BufferView b, int root) override {
    STRATA_MPI_CHECK(MPI_Bcast(b.data, as_int(b.count), to_mpi(b.dtype), root, comm_));
  }
  void do_reduce(BufferView b, int root) override {
    const void* send = rank() == root ? MPI_IN_PLACE : b.data;
    STRATA_MPI_CHECK(MPI_Reduce(send, b.data, as_int(b.count), to_mpi(b.dtype),
                                mpi_op(b.dtype, false), root, comm_));
  }
  void do_send(BufferView b, int peer, int tag) override {
    MPI_Request request;
    STRATA_MPI_CHECK(
        MPI_Isend(b.data, as_int(b.count), to_mpi(b.dtype), peer, tag, comm_, &request));
    yield_until_done(request);
  }
  void do_recv(BufferView b, int peer, int tag) override {
    MPI_Request request;
    STRATA_MPI_CHECK(
        MPI_Irecv(b.data, as_int(b.count), to_mpi(b.dtype), peer, tag, comm_, &request));
    yield_until_done(request);
  }
  void do_barrier() override { STRATA_MPI_CHECK(MPI_Barrier(comm_)); }
  void do_all_to_all(BufferView in, const std::vector<std::size_t>& send_counts, BufferView out,
                     const std::vector<std::size_t>& recv_counts) override {
    const std::vector<int> sends = ints(send_counts), recvs = ints(recv_counts);
    STRATA_MPI_CHECK(MPI_Alltoallv(in.data, sends.data(), displacements(sends).data(),
                                   to_mpi(in.dtype), out.data, recvs.data(),
                                   displacements(recvs).data(), to_mpi(out.dtype), comm_));
  }

 private:
  static std::vector<int> ints(const std::vector<std::size_t>& counts) {
    std::vector<int> out;
    for (std::size_t c : counts) out.push_back(as_int(c));
    return out;
  }
  static std::vector<int> displacements(const std::vector<int>& counts) {
    std::vector<int> at(counts.size(), 0);
    for (std::size_t i = 1; i < counts.size(); ++i)
      at[i] = as_int(std::size_t(at[i - 1]) + std::size_t(counts[i - 1]));
    return at;
  }
  static int rank_of(MPI_Comm c) {
    int r = 0;
    MPI_Comm_rank(c, &r);
    return r;
  }
  static int size_of(MPI_Comm c) {
    int s = 0;
    MPI_Comm_size(c, &s);
    return s;
  }
  MPI_Comm comm_;
};

// A process no launcher started is an MPI singleton of one rank. Open MPI would start an orted
// for it (to spawn processes later: strata never does) and open UCX and every byte transport
// (for peers it has none of): 0.37 s of a 0.72 s 1-rank tiny run (2 cores, 2026-12-04). The
// user's own settings of these parameters win (setenv does not overwrite); other MPIs ignore them.
void prefer_lone_singleton() {
  ::setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
  ::setenv("OMPI_MCA_pml", "ob1", 0);
  ::setenv("OMPI_MCA_btl", "self", 0);
}

}  // namespace

void init(int* argc, char*** argv, bool alone) {
  if (alone) prefer_lone_singleton();
  int provided = 0;
  STRATA_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (provided < MPI_THREAD_MULTIPLE)
    throw Error("the MPI library does not provide MPI_THREAD_MULTIPLE",
                "comm streams call MPI from worker threads; use an MPI built with thread support");
  STRATA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_control));
  STRATA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_notices));
}

void finalize() {
  if (!initialized()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  {
    // Notices nobody will receive any more (the job is over): let MPI finish them on its own.
    std::lock_guard lock(g_notices_mu);
    for (PendingNotice& p : g_pending) MPI_Request_free(&p.request);
    g_pending.clear();
  }
  if (g_control != MPI_COMM_NULL) MPI_Comm_free(&g_control);
  if (g_notices != MPI_COMM_NULL) MPI_Comm_free(&g_notices);
  MPI_Finalize();
}

bool initialized() {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

LocalRank local_rank() {
  MPI_Comm local;
  STRATA_MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
  LocalRank r;
  MPI_Comm_rank(local, &r.rank);
  MPI_Comm_size(local, &r.size);
  MPI_Comm_free(&local);
  return r;
}

namespace {
// MPI_Test every millisecond: a blocking MPI call would poll, taking a core from local rank 0.
void sleep_until_done(MPI_Request& request) {
  for (int done = 0;;) {
    STRATA_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

struct NodeComm {
  MPI_Comm comm = MPI_COMM_NULL;
  NodeComm() {
    STRATA_MPI_CHECK(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &comm));
  }
  ~NodeComm() { MPI_Comm_free(&comm); }
};
}  // namespace

void node_barrier() {
  ControlCall watched(CommOp::barrier, 0);
  NodeComm node;
  MPI_Request request;
  STRATA_MPI_CHECK(MPI_Ibarrier(node.comm, &request));
  sleep_until_done(request);
}

void node_broadcast(double* values, int n) {
  ControlCall watched(CommOp::broadcast, sizeof(double) * std::size_t(n));
  NodeComm node;
  MPI_Request request;
  STRATA_MPI_CHECK(MPI_Ibcast(values, n, MPI_DOUBLE, 0, node.comm, &request));
  sleep_until_done(request);
}

int node_ranks_with(std::uint64_t value) {
  ControlCall watched(CommOp::all_gather, sizeof value);
  NodeComm node;
  int size = 1;
  MPI_Comm_size(node.comm, &size);
  std::vector<std::uint64_t> all(std::size_t(size), 0);
  MPI_Request request;
  STRATA_MPI_CHECK(
      MPI_Iallgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, node.comm, &request));
  sleep_until_done(request);
  return int(std::count(all.begin(), all.end(), value));
}

std::string processor_name() {
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  return std::string(name, len);
}

std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, len);
  if (auto nl = s.find_first_of("\r\n,"); nl != std::string::npos) s.resize(nl);
  return s;
}

std::unique_ptr<Group> split(const std::string& name, int color, int key, CommLedger* ledger) {
  ControlCall watched(CommOp::barrier, 0);  // a collective over the world, like any other
  MPI_Comm comm;
  STRATA_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::make_unique<MpiGroup>(name, comm, ledger);
}

void control_allreduce_sum(double* values, int n) {
  ControlCall watched(CommOp::all_reduce, sizeof(double) * std::size_t(n));
  STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_SUM, g_control));
}

void control_allreduce_max(double* values, int n) {
  ControlCall watched(CommOp::all_reduce, sizeof(double) * std::size_t(n));
  STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_MAX, g_control));
}

std::vector<double> control_gather(const std::vector<double>& local) {
  ControlCall watched(CommOp::all_gather, sizeof(double) * local.size());
  int n = int(local.size());
  std::vector<double> all(world_rank() == 0 ? std::size_t(n) * world_size() : 0);
  STRATA_MPI_CHECK(
      MPI_Gather(local.data(), n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, 0, g_control));
  return all;
}

std::vector<std::string> control_gather_strings(const std::string& local) {
  ControlCall watched(CommOp::all_gather, local.size());
  int len = int(local.size());
  int ranks = world_size();
  bool root = world_rank() == 0;
  std::vector<int> lens(root ? ranks : 0), displs(root ? ranks : 0);
  STRATA_MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, g_control));
  std::string all;
  if (root) {
    int total = 0;
    for (int r = 0; r < ranks; ++r) displs[r] = total, total += lens[r];
    all.resize(total);
  }
  STRATA_MPI_CHECK(MPI_Gatherv(local.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(),
                               MPI_CHAR, 0, g_control));
  std::vector<std::string> out;
  for (int r = 0; root && r < ranks; ++r) out.push_back(all.substr(displs[r], lens[r]));
  return out;
}

std::vector<std::vector<double>> control_gather_varying(const std::vector<double>& local) {
  ControlCall watched(CommOp::all_gather, sizeof(double) * local.size());
  int n = int(local.size());
  const int ranks = world_size();
  const bool root = world_rank() == 0;
  std::vector<int> counts(root ? ranks : 0), displs(root ? ranks : 0);
  STRATA_MPI_CHECK(MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, g_control));
  std::vector<double> all;
  if (root) {
    int total = 0;
    for (int r = 0; r < ranks; ++r) displs[r] = total, total += counts[r];
    all.resize(total);
  }
  STRATA_MPI_CHECK(MPI_Gatherv(local.data(), n, MPI_DOUBLE, all.data(), counts.data(),
                               displs.data(), MPI_DOUBLE, 0, g_control));
  std::vector<std::vector<double>> out;
  for (int r = 0; root && r < ranks; ++r)
    out.emplace_back(all.begin() + displs[r], all.begin() + displs[r] + counts[r]);
  return out;
}

void control_barrier() {
  ControlCall watched(CommOp::barrier, 0);
  STRATA_MPI_CHECK(MPI_Barrier(g_control));
}

std::vector<InFlight> control_in_flight() {
  std::lock_guard lock(g_calls_mu);
  std::vector<InFlight> out;
  for (const auto& [token, f] : g_calls) out.push_back(f);
  return out;
}

void post_notice(int to, Notice kind, const std::string& payload) {
  std::lock_guard lock(g_notices_mu);
  int pending_to_peer = 0;
  for (auto it = g_pending.begin(); it != g_pending.end();) {
    int done = 0;
    MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    if (done) {
      it = g_pending.erase(it);
    } else {
      pending_to_peer += it->to == to;
      ++it;
    }
  }
  if (pending_to_peer >= kMaxPendingPerPeer) return;  // not listening: stopped, dead or finished
  PendingNotice p{MPI_REQUEST_NULL, to, std::make_unique<std::string>(payload)};
  if (MPI_Isend(p.payload->data(), int(p.payload->size()), MPI_CHAR, to, int(kind), g_notices,
                &p.request) == MPI_SUCCESS)
    g_pending.push_back(std::move(p));
}

bool poll_notice(Notice kind, int* from, std::string* payload) {
  int flag = 0;
  MPI_Status status;
  if (g_notices == MPI_COMM_NULL ||
      MPI_Iprobe(MPI_ANY_SOURCE, int(kind), g_notices, &flag, &status) != MPI_SUCCESS || !flag)
    return false;
  int len = 0;
  MPI_Get_count(&status, MPI_CHAR, &len);
  payload->assign(std::size_t(len), '\0');
  MPI_Recv(payload->data(), len, MPI_CHAR, status.MPI_SOURCE, int(kind), g_notices,
           MPI_STATUS_IGNORE);
  *from = status.MPI_SOURCE;
  return true;
}

void send_error_to_root(const std::string& message) { post_notice(0, Notice::error, message); }

void abort_job(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  // A supervising runner ends the job itself, at once (job_end_note.hpp); MPI_Abort would hold
  // this rank in PMIx_Abort until mpirun's kill sequence, seconds later, and a supervisor gone
  // leaves mpirun to end the others after this non-zero exit as it would.
  if (write_job_end_note(code)) std::_Exit(code);
  if (world_size() == 1) std::_Exit(code);  // nothing else to end: spare the user MPI's banner
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace strata::mpi
