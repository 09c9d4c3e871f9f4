// The gloo transport: a Group whose calls are gloo's own collectives over gloo's tcp device, so
// that what a run over `--transport gloo` measures is gloo (PyTorch's CPU backend), not strata.
//
// Rendezvous: MPI, with the full mesh connected here. Debian's gloo has no MPI context, and a
// gloo::rendezvous::Store is a key-value store that every rank polls (set/get/wait by key): over
// MPI that needs a server rank or one-sided windows, where the mesh needs only one exchange. So
// each rank creates one tcp pair per peer, and MPI_Alltoall hands every rank the addresses that
// its peers' pairs for it listen on (n slots per rank, not gloo's n x n table an all-gather or a
// store would move); then every pair connects, in rank order as gloo's connectFullMesh does.
//
// Interface: STRATA_GLOO_IFNAME, else GLOO_SOCKET_IFNAME (PyTorch's variable, so a job that sets
// it for PyTorch binds the same NIC), names one interface. Unset: when every rank of the world is
// on one host, loopback (127.0.0.1: nothing leaves the host, as MPI's shared memory); on several
// hosts, the address this host's name resolves to (gloo's and PyTorch's default) unless that is
// loopback or nothing, else NCCL's rule: the first interface up that is not loopback, ib* first.
//
// One tcp device (one epoll thread) per process, shared by the groups through a shared_ptr like
// UCX's context; one gloo context (its pairs) per group.
//
// Collectives (gloo's algorithms; n ranks)
//   all_reduce      gloo::allreduce: ring (reduce-scatter + all-gather), 1 MiB segments
//   reduce_scatter  composed as PyTorch's ProcessGroupGloo does it: gloo::allreduce of a copy of
//                   the input, then this rank's shard (gloo has no usable reduce-scatter: see
//                   do_reduce_scatter). It moves the all-reduce's bytes: what a PyTorch user of
//                   gloo pays for FSDP/ZeRO's reduce-scatter.
//   all_gather      gloo::allgather (ring); in place when the input is this rank's slot
//   broadcast       gloo::broadcast
//   reduce          gloo::reduce; a non-root rank reduces into scratch, so its buffer stays as it
//                   was (as MPI_Reduce)
//   send, recv      gloo unbound buffers on the pair, slot = p2p prefix | tag (a pair keeps one
//                   slot's messages in order); a rank's messages to itself go through a mailbox
//   barrier         gloo::barrier
// Every reduction runs strata's reduce kernels (reduce_kernels.hpp), so bf16 (which gloo's math
// does not know) rounds as in the other transports. Collectives of a group run one at a time under
// a lock (their order must match across ranks anyway); point to point takes none.
#include "comm/gloo_transport.hpp"

#include <arpa/inet.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/config.h>
#include <gloo/context.h>
#include <gloo/reduce.h>
#include <gloo/transport/address.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "comm/reduce_kernels.hpp"

namespace strata::gloo_comm {
namespace {

using ucx::combine;  // the reduce kernels every host transport shares
using ucx::Op;

// Long: a rank that computes for minutes before its next collective is no error. Hangs are the
// runner's watchdog's to report (it names the rank and the call).
constexpr std::chrono::minutes kTimeout{30};
// Slots of point-to-point messages: above gloo's collective prefixes (0x01..0x08) and the small
// slots of its algorithm classes (Context::nextSlot).
constexpr std::uint64_t kP2pSlot = std::uint64_t(0x80) << 56;
constexpr std::size_t kAddressBytes = ::gloo::transport::Address::kMaxByteSize;

int world_rank() {
  int initialized = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw Error(
      "rank " + std::to_string(world_rank()) + ": " + call + " failed: " + std::string(text, len),
      "the gloo rendezvous is collective over MPI_COMM_WORLD: every rank must create "
      "the group");
}

// Runs a gloo call; its exceptions (timeouts, closed connections, enforce failures) become one
// strata::Error that names the rank, the group and the call.
template <class F>
void guarded(const std::string& group, const char* call, F&& f) {
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(world_rank()) + ": gloo " + call + " in group '" + group +
                    "' failed: " + e.what(),
                "a peer may have died first (its own error comes before this one)");
  }
}

std::string interface_names() {
  std::string out;
  if (struct if_nameindex* list = if_nameindex()) {
    for (struct if_nameindex* i = list; i->if_index != 0; ++i)
      out += (out.empty() ? "" : ", ") + std::string(i->if_name);
    if_freenameindex(list);
  }
  return out;
}

// This host's name when it resolves to an address that is not loopback (Debian's /etc/hosts maps
// it to 127.0.1.1, which other hosts cannot reach), else "". Checked here because gloo's own
// lookup reads getaddrinfo's result even when the call failed (a crash, not an error).
std::string lookup_routable_hostname() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host, nullptr, &hints, &found) != 0) return "";
  bool routable = false;
  for (addrinfo* a = found; a != nullptr && !routable; a = a->ai_next) {
    if (a->ai_family == AF_INET)
      routable = (ntohl(reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr) >> 24) != 127;
    else if (a->ai_family == AF_INET6)
      routable = !IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
  }
  freeaddrinfo(found);
  return routable ? host : "";
}

// Looked up once a process: every mesh group's context asks (8 DNS lookups a rank in a 4-rank ddp
// run, 1 with this), and a name only DNS could answer can cost the resolver's timeout when asked
// again at once. On the local Slurm cluster, whose nodes n1..n4 no resolver knows, 12 lookups in a
// row took 5.0 s in 6 of 9 processes, one lookup 1-4 ms in 12 of 12 (2026-12-07); its 4-rank gloo
// runs took 6.8-7.0 s, 1.7-2.1 s with this.
std::string routable_hostname() {
  static const std::string host = lookup_routable_hostname();
  return host;
}

// NCCL's rule for its sockets: the first interface that is up, has an address and is not
// loopback, InfiniBand (ib*) first; "" when there is none.
std::string first_network_interface() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string first, first_ib;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK))
      continue;
    if (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6) continue;
    const std::string name = i->ifa_name;
    if (name.rfind("docker", 0) == 0 || name.rfind("virbr", 0) == 0) continue;
    if (first.empty()) first = name;
    if (first_ib.empty() && name.rfind("ib", 0) == 0) first_ib = name;
  }
  freeifaddrs(list);
  return first_ib.empty() ? first : first_ib;
}

struct Binding {
  ::gloo::transport::tcp::attr attr;
  std::string description;
};

Binding binding(bool one_host) {
  const char* var = "STRATA_GLOO_IFNAME";
  const char* name = std::getenv(var);
  if (name == nullptr || *name == '\0') name = std::getenv(var = "GLOO_SOCKET_IFNAME");
  Binding b;
  if (name != nullptr && *name != '\0') {
    if (std::strchr(name, ',') != nullptr || if_nametoindex(name) == 0)
      throw Error(std::string(var) + "='" + name +
                      "': not one network interface of this host (it has: " + interface_names() +
                      ")",
                  "name one interface, or unset it (one host: loopback; several: the host's name)");
    b.attr.iface = name;
    b.description = "interface " + std::string(name) + " (" + var + ")";
  } else if (one_host) {
    b.attr.hostname = "127.0.0.1";
    b.description = "host 127.0.0.1 (every rank on this host)";
  } else if (const std::string host = routable_hostname(); !host.empty()) {
    b.attr.hostname = host;
    b.description = "host " + host + " (this host's name)";
  } else if (const std::string nic = first_network_interface(); !nic.empty()) {
    b.attr.iface = nic;
    b.description = "interface " + nic + " (the first one up, not loopback)";
  } else {
    throw Error(
        "gloo: the ranks are on several hosts, and this host's name resolves to no "
        "address other hosts can reach, and no interface but loopback is up",
        "set STRATA_GLOO_IFNAME to the interface the hosts reach each other on");
  }
  return b;
}

std::mutex g_device_mu;
std::weak_ptr<::gloo::transport::Device> g_device;
std::string g_binding;  // the description of g_device's binding, or of the last one

std::shared_ptr<::gloo::transport::Device> shared_device(bool one_host) {
  Binding b = binding(one_host);
  std::lock_guard lock(g_device_mu);
  std::shared_ptr<::gloo::transport::Device> device = g_device.lock();
  if (device && g_binding == b.description) return device;
  try {
    device = ::gloo::transport::tcp::CreateDevice(b.attr);
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(world_rank()) + ": gloo cannot bind its tcp device to " +
                    b.description + ": " + e.what(),
                "set STRATA_GLOO_IFNAME to an interface that has an address (ip -br addr)");
  }
  g_device = device;
  g_binding = b.description;
  return device;
}

// Whether every world rank runs on this host; `local_rank` is this rank's index among those that
// do. Collective over MPI_COMM_WORLD.
bool world_on_one_host(int* local_rank) {
  MPI_Comm node = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
  int node_size = 0, world_size = 0;
  MPI_Comm_rank(node, local_rank);
  MPI_Comm_size(node, &node_size);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_free(&node);
  return node_size == world_size;
}

// A gloo context whose full mesh of tcp pairs is connected through MPI (see the top of the file).
class MeshContext final : public ::gloo::Context {
 public:
  MeshContext(int rank, int size, const std::shared_ptr<::gloo::transport::Device>& device,
              MPI_Comm comm, int local_rank)
      : ::gloo::Context(rank, size) {
    setTimeout(kTimeout);
    std::shared_ptr<::gloo::transport::Context> pairs = device->createContext(rank, size);
    pairs->setTimeout(kTimeout);
    constexpr std::size_t kSlot = sizeof(std::uint32_t) + kAddressBytes;  // length, address
    std::vector<char> mine(std::size_t(size) * kSlot), theirs(mine.size());
    for (int i = 0; i < size; ++i) {
      if (i == rank) continue;
      auto& pair = pairs->createPair(i);
      pair->setLocalRank(local_rank);
      const std::vector<char> address = pair->address().bytes();
      const auto length = std::uint32_t(address.size());
      if (length > kAddressBytes) throw Error("gloo: a tcp pair address is over its maximum size");
      std::memcpy(&mine[i * kSlot], &length, sizeof length);
      std::memcpy(&mine[i * kSlot + sizeof length], address.data(), length);
    }
    check_mpi(
        MPI_Alltoall(mine.data(), int(kSlot), MPI_BYTE, theirs.data(), int(kSlot), MPI_BYTE, comm),
        "MPI_Alltoall");
    for (int i = 0; i < size; ++i) {
      if (i == rank) continue;
      std::uint32_t length = 0;
      std::memcpy(&length, &theirs[i * kSlot], sizeof length);
      const char* at = &theirs[i * kSlot + sizeof length];
      pairs->getPair(i)->connect(std::vector<char>(at, at + length));
    }
    device_ = device;
    transportContext_ = std::move(pairs);
  }
};

// A rank's messages to itself (a group of one, or a ring's neighbour on one rank): gloo has no
// pair to self. Buffered: a send returns once copied; a receive waits for its tag's next message.
class Mailbox {
 public:
  void send(const void* data, std::size_t bytes, int tag) {
    std::lock_guard lock(mu_);
    const char* p = static_cast<const char*>(data);
    boxes_[tag].emplace_back(p, p + bytes);
    cv_.notify_all();
  }
  void recv(void* data, std::size_t bytes, int tag, const std::string& group) {
    std::unique_lock lock(mu_);
    std::deque<std::vector<char>>& box = boxes_[tag];
    cv_.wait(lock, [&] { return !box.empty(); });
    std::vector<char> message = std::move(box.front());
    box.pop_front();
    if (message.size() != bytes)
      throw Error("gloo group '" + group + "': a message to self of " +
                  std::to_string(message.size()) + " bytes met a receive of " +
                  std::to_string(bytes));
    if (bytes != 0) std::memcpy(data, message.data(), bytes);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, std::deque<std::vector<char>>> boxes_;
};

// Calls f with a value of the unsigned type of t's element size: gloo's options take the element
// size from their template type, and every reduction is strata's own.
template <class F>
void by_element_size(DType t, F&& f) {
  switch (dtype_size(t)) {
    case 1:
      return f(std::uint8_t{});
    case 2:
      return f(std::uint16_t{});
    case 4:
      return f(std::uint32_t{});
    default:
      return f(std::uint64_t{});
  }
}

::gloo::AllreduceOptions::Func reducer(DType t, Op op) {
  return
      [t, op](void* c, const void* a, const void* b, std::size_t n) { combine(c, a, b, n, t, op); };
}

class GlooGroup final : public Group {
 public:
  GlooGroup(std::string name, int rank, int size, CommLedger* ledger,
            std::shared_ptr<MeshContext> context)
      : Group(std::move(name), rank, size, ledger), context_(std::move(context)) {}

 protected:
  void do_all_reduce(BufferView b, Reduction r) override {
    std::lock_guard lock(collective_mu_);
    allreduce(b.data, b.count, b.dtype, r == Reduction::sum ? Op::sum : Op::max);
  }

  // As PyTorch's ProcessGroupGloo::reduce_scatter_tensor: an all-reduce of a copy of the input,
  // then this rank's shard. gloo's options API has no reduce-scatter, and its algorithm class
  // ReduceScatterHalvingDoubling was tried first and dropped: its last phase copies a rank's
  // result to the front of the buffer without waiting for the send of that front half, which the
  // tcp device may still be writing. Seen here as wrong sums in --calibrate-comm's 16 MiB
  // reduce_scatter on 2 ranks, one run in five.
  void do_reduce_scatter(BufferView in, BufferView out) override {
    std::lock_guard lock(collective_mu_);
    char* copy = scratch(in.bytes());
    std::memcpy(copy, in.data, in.bytes());
    allreduce(copy, in.count, in.dtype, Op::sum);
    std::memcpy(out.data, copy + std::size_t(rank()) * out.bytes(), out.bytes());
  }

  // In place when in is this rank's slot of out (in.data == out.data + rank * in.bytes()).
  void do_all_gather(BufferView in, BufferView out) override {
    char* slot = static_cast<char*>(out.data) + std::size_t(rank()) * in.bytes();
    std::lock_guard lock(collective_mu_);
    by_element_size(in.dtype, [&](auto e) {
      using T = decltype(e);
      ::gloo::AllgatherOptions o(context_);
      if (slot != in.data) o.setInput(static_cast<T*>(in.data), in.count);
      o.setOutput(static_cast<T*>(out.data), out.count);
      o.setTag(next_tag());
      guarded(name(), "allgather", [&] { ::gloo::allgather(o); });
    });
  }

  void do_broadcast(BufferView b, int root) override {
    std::lock_guard lock(collective_mu_);
    by_element_size(b.dtype, [&](auto e) {
      using T = decltype(e);
      ::gloo::BroadcastOptions o(context_);
      o.setOutput(static_cast<T*>(b.data), b.count);
      o.setRoot(root);
      o.setTag(next_tag());
      guarded(name(), "broadcast", [&] { ::gloo::broadcast(o); });
    });
  }

  // Sum into the root's buffer; a non-root rank's gloo output is scratch, its buffer its input.
  void do_reduce(BufferView b, int root) override {
    std::lock_guard lock(collective_mu_);
    char* partial = rank() == root ? nullptr : scratch(b.bytes());
    by_element_size(b.dtype, [&](auto e) {
      using T = decltype(e);
      ::gloo::ReduceOptions o(context_);
      if (rank() != root) {
        o.setInput(static_cast<T*>(b.data), b.count);
        o.setOutput(reinterpret_cast<T*>(partial), b.count);
      } else {
        o.setOutput(static_cast<T*>(b.data), b.count);
      }
      o.setRoot(root);
      o.setReduceFunction(reducer(b.dtype, Op::sum));
      o.setTag(next_tag());
      guarded(name(), "reduce", [&] { ::gloo::reduce(o); });
    });
  }

  void do_send(BufferView b, int peer, int tag) override {
    if (peer == rank()) return self_.send(b.data, b.bytes(), tag);
    auto buffer = context_->createUnboundBuffer(b.data, b.bytes());
    guarded(name(), "send", [&] {
      buffer->send(peer, p2p_slot(tag));
      buffer->waitSend();
    });
  }
  void do_recv(BufferView b, int peer, int tag) override {
    if (peer == rank()) return self_.recv(b.data, b.bytes(), tag, name());
    auto buffer = context_->createUnboundBuffer(b.data, b.bytes());
    guarded(name(), "recv", [&] {
      buffer->recv(peer, p2p_slot(tag));
      buffer->waitRecv();
    });
  }

  // gloo's alltoallv (its pairs' unbound buffers, every block posted at once).
  void do_all_to_all(BufferView in, const std::vector<std::size_t>& send_counts, BufferView out,
                     const std::vector<std::size_t>& recv_counts) override {
    const std::vector<std::int64_t> sends(send_counts.begin(), send_counts.end()),
        recvs(recv_counts.begin(), recv_counts.end());
    std::lock_guard lock(collective_mu_);
    by_element_size(in.dtype, [&](auto e) {
      using T = decltype(e);
      ::gloo::AlltoallvOptions o(context_);
      o.setInput(static_cast<T*>(in.data), sends);
      o.setOutput(static_cast<T*>(out.data), recvs);
      o.setTag(next_tag());
      guarded(name(), "alltoallv", [&] { ::gloo::alltoallv(o); });
    });
  }

  void do_barrier() override {
    std::lock_guard lock(collective_mu_);
    ::gloo::BarrierOptions o(context_);
    o.setTag(next_tag());
    guarded(name(), "barrier", [&] { ::gloo::barrier(o); });
  }

 private:
  static std::uint64_t p2p_slot(int tag) { return kP2pSlot | std::uint32_t(tag); }
  // One tag per collective (under the lock): consecutive collectives never share a slot.
  std::uint32_t next_tag() { return tag_++; }

  // Under the collective lock.
  void allreduce(void* data, std::size_t count, DType t, Op op) {
    by_element_size(t, [&](auto e) {
      using T = decltype(e);
      ::gloo::AllreduceOptions o(context_);
      o.setOutput(static_cast<T*>(data), count);  // the output is the input too
      o.setReduceFunction(reducer(t, op));
      o.setTag(next_tag());
      guarded(name(), "allreduce", [&] { ::gloo::allreduce(o); });
    });
  }

  // The group's scratch buffer, at least `bytes` long. Grown, never shrunk: big collectives
  // repeat, and fresh pages would cost a fault per 4 KiB every call.
  char* scratch(std::size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }

  std::shared_ptr<MeshContext> context_;
  std::mutex collective_mu_;  // also owns tag_ and scratch_
  std::uint32_t tag_ = 0;
  std::vector<char> scratch_;
  Mailbox self_;
};

}  // namespace

std::unique_ptr<Group> split(const std::string& name, int color, int key, CommLedger* ledger) {
  int local_rank = 0;
  const bool one_host = world_on_one_host(&local_rank);
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm), "MPI_Comm_split");
  // The communicator only carries the rendezvous: freed once the pairs are connected.
  struct Free {
    MPI_Comm* comm;
    ~Free() { MPI_Comm_free(comm); }
  } free_comm{&comm};
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  std::shared_ptr<MeshContext> context;
  guarded(name, "rendezvous", [&] {
    context = std::make_shared<MeshContext>(rank, size, shared_device(one_host), comm, local_rank);
  });
  check_mpi(MPI_Barrier(comm), "MPI_Barrier");  // every member's pairs are connected from here on
  return std::make_unique<GlooGroup>(name, rank, size, ledger, std::move(context));
}

std::string library_version() {
  std::string v = "gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." +
                  std::to_string(GLOO_VERSION_MINOR) + "." + std::to_string(GLOO_VERSION_PATCH) +
                  " (tcp";
  std::lock_guard lock(g_device_mu);
  if (!g_device.expired()) v += ", " + g_binding;
  return v + ")";
}

std::string interface_choice(bool one_host) { return binding(one_host).description; }

}  // namespace strata::gloo_comm
