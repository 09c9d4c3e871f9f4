// A host transport (ucx or gloo: `test_transport ucx|gloo`) against the MPI transport, as an MPI
// program (mpirun -np 1..5): every collective and dtype on the same data through both groups,
// results compared bit for bit; point to point across threads and tags; subgroups; bad arguments.
//
// Data are small integers, exact in every dtype (u8 sums wrap the same way on both), so the order
// in which a transport adds them cannot change a result. For ucx, STRATA_UCX_SMALL_BYTES is lowered
// to 4 KiB (unless set) so that the odd sizes below hit both the latency algorithms (recursive
// doubling, binomial trees) and the bandwidth ones (ring, chain) on every world size; the largest
// size is over the ring's segment size, so segmentation with a partial last segment is covered too.
//
// Only rank 0 prints gtest's output; other ranks print their failures, prefixed by their rank. Each
// rank exits non-zero when a test failed on it (or, through a final all-reduce, on any rank).
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_transport.hpp"
#include "comm/transport.hpp"
#ifdef STRATA_HAVE_GLOO
#include "comm/gloo_transport.hpp"
#endif
#include "strata/comm.hpp"
#include "strata/types.hpp"
#include "transport_conformance.hpp"

namespace {

using namespace conformance;
using strata::BufferView;
using strata::CommLedger;
using strata::DType;
using strata::Group;

constexpr std::size_t kLarge = (std::size_t(3) << 20) / 4 + 13;  // odd, over every switch
constexpr std::size_t kSizes[] = {1, 7, 1000, 1023, 4099, kLarge};

// The groups every test uses: the world over the transport under test and over MPI, each with its
// own ledger.
struct World {
  CommLedger tr_ledger, mpi_ledger;
  std::unique_ptr<Group> tr, mpi;
};
World* g_world = nullptr;
std::string g_transport;  // the transport under test

class TransportVsMpi : public ::testing::Test {
 protected:
  Group& tr() { return *g_world->tr; }
  Group& mpi() { return *g_world->mpi; }
  int rank() const { return g_world->tr->rank(); }
  int size() const { return g_world->tr->size(); }
};

TEST_F(TransportVsMpi, GroupShapeAndVersion) {
  EXPECT_EQ(tr().rank(), mpi().rank());
  EXPECT_EQ(tr().size(), mpi().size());
  EXPECT_EQ(tr().size(), world_size());
  const std::string v = strata::transport_version(g_transport);
  EXPECT_EQ(v.rfind(g_transport == "ucx" ? "UCX 1." : "gloo 0.", 0), 0u) << v;
  if (g_transport == "gloo") {  // where the tcp device bound: the named interface, or loopback
    const char* ifname = std::getenv("STRATA_GLOO_IFNAME");
    const std::string want = ifname ? "interface " + std::string(ifname) + " (STRATA_GLOO_IFNAME)"
                                    : "host 127.0.0.1 (every rank on this host)";
    EXPECT_NE(v.find(want), std::string::npos) << v;
  }
}

TEST_F(TransportVsMpi, AllReduceSumAndMax) {
  for (DType t : kDtypes)
    for (std::size_t n : kSizes) {
      Buf a(t, n, [&](std::size_t i) { return sum_value(t, rank(), i, 1); }), b = a;
      mpi().all_reduce(a.view());
      tr().all_reduce(b.view());
      expect_same(b, a, label("all_reduce", t, n));

      Buf c(t, n, [&](std::size_t i) { return max_value(rank(), i, 2); }), d = c;
      mpi().all_reduce_max(c.view());
      tr().all_reduce_max(d.view());
      expect_same(d, c, label("all_reduce_max", t, n));
    }
}

TEST_F(TransportVsMpi, ReduceScatterOutOfPlaceAndInPlace) {
  for (DType t : kDtypes)
    for (std::size_t shard : kSizes) {
      if (shard == kLarge) shard = kLarge / std::size_t(size()) + 3;
      const std::size_t n = shard * std::size_t(size());
      Buf in(t, n, [&](std::size_t i) { return sum_value(t, rank(), i, 3); }), keep = in;
      Buf want(t, shard), got(t, shard);
      mpi().reduce_scatter(in.view(), want.view());
      tr().reduce_scatter(in.view(), got.view());
      expect_same(got, want, label("reduce_scatter", t, n));
      expect_same(in, keep, label("reduce_scatter leaves its input", t, n));

      // ZeRO's layout: the output is this rank's shard of the input.
      const std::size_t slot = std::size_t(rank()) * shard;
      tr().reduce_scatter(in.view(), in.view(slot, shard));
      Buf in_shard(t, shard);
      std::memcpy(in_shard.bytes(), in.bytes() + slot * in.esize(), shard * in.esize());
      expect_same(in_shard, want, label("reduce_scatter in place", t, n));
    }
}

TEST_F(TransportVsMpi, AllGatherOutOfPlaceAndInPlace) {
  for (DType t : kDtypes)
    for (std::size_t shard : kSizes) {
      if (shard == kLarge) shard = kLarge / std::size_t(size()) + 3;
      const std::size_t n = shard * std::size_t(size());
      Buf in(t, shard, [&](std::size_t i) { return sum_value(t, rank(), i, 4); });
      Buf want(t, n), got(t, n);
      mpi().all_gather(in.view(), want.view());
      tr().all_gather(in.view(), got.view());
      expect_same(got, want, label("all_gather", t, n));

      Buf full(t, n);
      const std::size_t slot = std::size_t(rank()) * shard;
      std::memcpy(full.bytes() + slot * in.esize(), in.bytes(), shard * in.esize());
      tr().all_gather(full.view(slot, shard), full.view());
      expect_same(full, want, label("all_gather in place", t, n));
    }
}

// Equal blocks (all_to_all) and blocks of any size, empty ones included (all_to_allv), against
// the known result and MPI's.
TEST_F(TransportVsMpi, AllToAllEqualAndVaryingBlocks) {
  for (DType t : kDtypes)
    for (std::size_t scale : {std::size_t(1), std::size_t(7), std::size_t(1023), kLarge / 8})
      for (bool varying : {false, true}) {
        AllToAllCase c = all_to_all_case(t, rank(), size(), scale, varying);
        const std::size_t n = c.want.count();
        Buf want(t, n), got(t, n);
        mpi().all_to_allv(c.in.view(), c.send_counts, want.view(), c.recv_counts);
        tr().all_to_allv(c.in.view(), c.send_counts, got.view(), c.recv_counts);
        expect_same(want, c.want, label("all_to_allv over MPI", t, n));
        expect_same(got, c.want, label("all_to_allv", t, n));
        if (varying) continue;
        Buf equal(t, n);
        tr().all_to_all(c.in.view(), equal.view());
        expect_same(equal, c.want, label("all_to_all", t, n));
      }
}

TEST_F(TransportVsMpi, BroadcastEveryRoot) {
  for (int root = 0; root < size(); ++root)
    for (DType t : kDtypes)
      for (std::size_t n : kSizes) {
        Buf a(t, n, [&](std::size_t i) { return sum_value(t, rank(), i, 5 + root); }), b = a;
        mpi().broadcast(a.view(), root);
        tr().broadcast(b.view(), root);
        expect_same(b, a, label("broadcast", t, n, root));
      }
}

TEST_F(TransportVsMpi, ReduceEveryRoot) {
  for (int root = 0; root < size(); ++root)
    for (DType t : kDtypes)
      for (std::size_t n : kSizes) {
        // The whole buffer on every rank: the root's sum, the others' data untouched.
        Buf a(t, n, [&](std::size_t i) { return sum_value(t, rank(), i, 6 + root); }), b = a;
        mpi().reduce(a.view(), root);
        tr().reduce(b.view(), root);
        expect_same(b, a, label("reduce", t, n, root));
      }
}

TEST_F(TransportVsMpi, EmptyBuffersAndBarrier) {
  Buf empty(DType::f32, 0);
  tr().all_reduce(empty.view());
  tr().all_gather(empty.view(), empty.view());
  tr().reduce_scatter(empty.view(), empty.view());
  tr().broadcast(empty.view(), size() - 1);
  tr().reduce(empty.view(), 0);
  for (int i = 0; i < 5; ++i) tr().barrier();

  // Nobody leaves the barrier before rank 0 enters it.
  mpi().barrier();
  const auto t0 = std::chrono::steady_clock::now();
  if (rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  tr().barrier();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.15) << "rank " << rank() << " left the barrier early";

  const auto records = g_world->tr_ledger.records();
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.back().op, strata::CommOp::barrier);
  EXPECT_EQ(records.back().group, g_transport + "-world");
  EXPECT_EQ(records.back().group_size, size());
}

// Bit-identical all_reduce results on every rank, also where the order of summation matters
// (random reals): rank 0's result, broadcast over MPI, against each rank's.
TEST_F(TransportVsMpi, AllReduceIsIdenticalOnEveryRank) {
  std::mt19937 rng(1234 + rank());
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (std::size_t n : {std::size_t(1000), kLarge}) {  // recursive doubling, ring
    for (int max : {0, 1}) {
      std::vector<float> v(n);
      for (float& x : v) x = dist(rng);
      if (max)
        tr().all_reduce_max(strata::view(v.data(), n));
      else
        tr().all_reduce(strata::view(v.data(), n));
      std::vector<float> root = v;
      MPI_Bcast(root.data(), int(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
      EXPECT_EQ(std::memcmp(root.data(), v.data(), n * sizeof(float)), 0)
          << (max ? "all_reduce_max" : "all_reduce") << " x" << n << " differs from rank 0's";
    }
  }
}

// Runs f on a thread; join() rethrows what it threw.
class Thread {
 public:
  explicit Thread(std::function<void()> f)
      : t_([this, f = std::move(f)] {
          try {
            f();
          } catch (...) {
            error_ = std::current_exception();
          }
        }) {}
  void join() {
    t_.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
  std::thread t_;
};

// A ring exchange: two messages with tags 1 and 2 to the right neighbour, sent from two threads,
// received from the left in the other order (tag 2 first). Small (eager) and large (rendezvous)
// messages; on one rank the neighbour is the rank itself.
TEST_F(TransportVsMpi, PointToPointTagsKeepStreamsApart) {
  const int right = (rank() + 1) % size(), left = (rank() + size() - 1) % size();
  for (std::size_t n : {std::size_t(5), std::size_t(300000)}) {
    Buf one(DType::i32, n, [&](std::size_t i) { return rank() * 1000 + 1 + i % 7; });
    Buf two(DType::i32, n, [&](std::size_t i) { return rank() * 1000 + 2 + i % 5; });
    Thread a([&] { tr().send(one.view(), right, 1); });
    Thread b([&] { tr().send(two.view(), right, 2); });
    Buf got2(DType::i32, n), got1(DType::i32, n);
    tr().recv(got2.view(), left, 2);
    tr().recv(got1.view(), left, 1);
    a.join();
    b.join();
    expect_same(got1, Buf(DType::i32, n, [&](std::size_t i) { return left * 1000 + 1 + i % 7; }),
                "tag 1 x" + std::to_string(n));
    expect_same(got2, Buf(DType::i32, n, [&](std::size_t i) { return left * 1000 + 2 + i % 5; }),
                "tag 2 x" + std::to_string(n));
  }
}

// Messages of one tag arrive in the order they were sent.
TEST_F(TransportVsMpi, PointToPointSameTagInOrder) {
  const int right = (rank() + 1) % size(), left = (rank() + size() - 1) % size();
  constexpr int kMessages = 4;
  for (std::size_t n : {std::size_t(100), std::size_t(200000)}) {
    std::vector<Buf> out;
    for (int k = 0; k < kMessages; ++k)
      out.emplace_back(DType::f64, n, [&](std::size_t i) { return k * 100000 + long(i); });
    Thread sender([&] {
      for (auto& m : out) tr().send(m.view(), right, 7);
    });
    for (int k = 0; k < kMessages; ++k) {
      Buf got(DType::f64, n);
      tr().recv(got.view(), left, 7);
      expect_same(got, out[k], "message " + std::to_string(k) + " of tag 7, x" + std::to_string(n));
    }
    sender.join();
  }
}

// Two groups (even and odd world ranks) at once, against MPI's split.
TEST_F(TransportVsMpi, SubgroupsAllReduce) {
  const int color = world_rank() % 2;
  CommLedger tr_ledger, mpi_ledger;
  auto tr_half = strata::split_group(g_transport, "half", color, world_rank(), &tr_ledger);
  auto mpi_half = strata::mpi::split("half", color, world_rank(), &mpi_ledger);
  ASSERT_EQ(tr_half->size(), mpi_half->size());
  ASSERT_EQ(tr_half->rank(), mpi_half->rank());
  EXPECT_EQ(tr_half->size(), (world_size() + 1 - color) / 2);
  for (DType t : {DType::f32, DType::i64, DType::u8})
    for (std::size_t n : {std::size_t(7), std::size_t(4099), kLarge}) {
      Buf a(t, n, [&](std::size_t i) { return sum_value(t, world_rank(), i, 8); }), b = a;
      mpi_half->all_reduce(a.view());
      tr_half->all_reduce(b.view());
      expect_same(b, a, "half " + std::to_string(color) + ": " + label("all_reduce", t, n));
    }
  // Both halves talk at once on the world group too: their tags are the world group's own.
  Buf c(DType::i32, 1000, [&](std::size_t i) { return sum_value(DType::i32, world_rank(), i, 9); }),
      d = c;
  mpi().all_reduce(c.view());
  tr().all_reduce(d.view());
  expect_same(d, c, label("all_reduce after split", DType::i32, 1000));
}

TEST_F(TransportVsMpi, BadArgumentsThrow) {
  Buf buf(DType::f32, 8);
  try {
    tr().send(buf.view(), size());
    ADD_FAILURE() << "a send to peer == size did not throw";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
  EXPECT_THROW(tr().recv(buf.view(), -1), strata::Error);
  EXPECT_THROW(tr().broadcast(buf.view(), size()), strata::Error);
  EXPECT_THROW(tr().reduce(buf.view(), -1), strata::Error);
  Buf wrong(DType::f32, 8 * std::size_t(size()) + 1);
  EXPECT_THROW(tr().all_gather(buf.view(), wrong.view()), strata::Error);
  EXPECT_THROW(tr().reduce_scatter(wrong.view(), buf.view()), strata::Error);
  // The group is still usable afterwards.
  tr().barrier();
}

#ifdef STRATA_HAVE_GLOO
// Where gloo's tcp device binds: the named interface wins; unset, one host binds loopback and
// several hosts never do (other hosts cannot reach it); a bad name is refused.
TEST(GlooBinding, InterfaceChoice) {
  using strata::gloo_comm::interface_choice;
  const char* saved = std::getenv("STRATA_GLOO_IFNAME");
  const std::string keep = saved ? saved : "";
  unsetenv("GLOO_SOCKET_IFNAME");
  setenv("STRATA_GLOO_IFNAME", "lo", 1);
  EXPECT_EQ(interface_choice(true), "interface lo (STRATA_GLOO_IFNAME)");
  EXPECT_EQ(interface_choice(false), "interface lo (STRATA_GLOO_IFNAME)");
  setenv("STRATA_GLOO_IFNAME", "nosuch0", 1);
  EXPECT_THROW(interface_choice(true), strata::Error);
  unsetenv("STRATA_GLOO_IFNAME");
  EXPECT_EQ(interface_choice(true), "host 127.0.0.1 (every rank on this host)");
  try {
    const std::string several = interface_choice(false);
    EXPECT_EQ(several.find("127."), std::string::npos) << several;
    EXPECT_NE(several, "interface lo (the first one up, not loopback)");
  } catch (const strata::Error& e) {  // a host with loopback only: refused, not bound to it
    EXPECT_NE(std::string(e.what()).find("no interface but loopback"), std::string::npos);
  }
  if (saved) setenv("STRATA_GLOO_IFNAME", keep.c_str(), 1);
}
#endif

// Non-zero ranks: only failures, with the rank in front.

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || (std::string(argv[1]) != "ucx" && std::string(argv[1]) != "gloo")) {
    std::fprintf(stderr, "usage: test_transport ucx|gloo [gtest options]\n");
    return 2;
  }
  g_transport = argv[1];
  argv[1] = argv[0];  // gtest and MPI see the other arguments only
  ++argv, --argc;
  setenv("STRATA_UCX_SMALL_BYTES", "4096", /*overwrite=*/0);
  return conformance::run_mpi_tests(argc, argv, [](int rank) {
    World world;
    world.tr = strata::split_group(g_transport, g_transport + "-world", 0, rank, &world.tr_ledger);
    world.mpi = strata::mpi::split("world", 0, rank, &world.mpi_ledger);
    g_world = &world;
    const int rc = RUN_ALL_TESTS();
    g_world = nullptr;
    return rc;
  });
}
