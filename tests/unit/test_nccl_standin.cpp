// The NCCL transport (core/src/backends/cuda/nccl_transport.cpp, unchanged) on the NCCL stand-in
// over MPI and the CUDA emulator, against the MPI transport, as an MPI program (mpirun -np 1..5):
// every collective and dtype on the same data through both groups, in place and out of place,
// results compared bit for bit; send/recv with tags; subgroups from ncclCommSplit; the
// compute-event wait; bad arguments; a failed rank, a refused tag and the stop flag ending waits
// instead of hanging.
//
// Buffers live in emulated device memory (cudaMalloc: NaN-filled, bounds-tracked); the stand-in
// refuses host pointers as NCCL does. Data are small integers, exact in every dtype (u8 sums stay
// under 256), so the order in which a transport adds them cannot change a result.
//
// Only rank 0 prints gtest's output; other ranks print their failures, prefixed by their rank.
// Each rank exits non-zero when a test failed on it (or, through a final all-reduce, on any rank).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <nccl.h>
#include <nccl_standin.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/device.hpp"
#include "backends/cuda/nccl_transport.hpp"
#include "comm/mpi_transport.hpp"
#include "comm/transport.hpp"
#include "strata/comm.hpp"
#include "strata/types.hpp"
#include "transport_conformance.hpp"

namespace {

using namespace conformance;
using strata::BufferView;
using strata::CommLedger;
using strata::DType;
using strata::Group;
using strata::nccl::NcclGroup;

constexpr std::size_t kSizes[] = {1, 7, 1000, 1023, 4099, 65537};

// The same elements in (emulated) device memory.
class Dev {
 public:
  explicit Dev(const Buf& host) : t_(host.dtype()), count_(host.count()) {
    STRATA_CUDA_CHECK(cudaMalloc(&data_, bytes()));
    if (bytes() > 0)
      STRATA_CUDA_CHECK(cudaMemcpy(data_, host.bytes(), bytes(), cudaMemcpyHostToDevice));
  }
  ~Dev() { (void)cudaFree(data_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::size_t bytes() const { return count_ * strata::dtype_size(t_); }
  BufferView view(std::size_t offset = 0, std::size_t count = SIZE_MAX) const {
    return {static_cast<unsigned char*>(data_) + offset * strata::dtype_size(t_),
            count == SIZE_MAX ? count_ - offset : count, t_};
  }
  Buf host() const {
    Buf out(t_, count_);
    if (bytes() > 0)
      STRATA_CUDA_CHECK(cudaMemcpy(out.bytes(), data_, bytes(), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  DType t_;
  std::size_t count_;
  void* data_ = nullptr;
};

// The groups every test uses: the world over NCCL and over MPI, each with its own ledger.
struct World {
  CommLedger nccl_ledger, mpi_ledger;
  std::unique_ptr<Group> nccl, mpi;
};
World* g_world = nullptr;

class NcclVsMpi : public ::testing::Test {
 protected:
  Group& nccl() { return *g_world->nccl; }
  Group& mpi() { return *g_world->mpi; }
  int rank() const { return g_world->nccl->rank(); }
  int size() const { return g_world->nccl->size(); }
};

TEST_F(NcclVsMpi, RegistryShapeAndVersion) {
  EXPECT_EQ(nccl().rank(), mpi().rank());
  EXPECT_EQ(nccl().size(), world_size());
  ASSERT_NE(dynamic_cast<NcclGroup*>(&nccl()), nullptr);
  EXPECT_TRUE(strata::transport_built("nccl"));
  EXPECT_EQ(strata::transport_version("nccl"), "NCCL 2.18.0");  // the stand-in's NCCL_VERSION_CODE
}

// Equal blocks (all_to_all) and blocks of any size, empty ones included (all_to_allv): grouped
// ncclSend / ncclRecv, against the known result and MPI's.
TEST_F(NcclVsMpi, AllToAllEqualAndVaryingBlocks) {
  for (DType t : kDtypes)
    for (std::size_t scale : {std::size_t(1), std::size_t(7), std::size_t(4099)})
      for (bool varying : {false, true}) {
        AllToAllCase c = all_to_all_case(t, rank(), size(), scale, varying);
        const std::size_t n = c.want.count();
        Buf want(t, n);
        const Dev in(c.in), got(Buf(t, n));
        mpi().all_to_allv(c.in.view(), c.send_counts, want.view(), c.recv_counts);
        nccl().all_to_allv(in.view(), c.send_counts, got.view(), c.recv_counts);
        expect_same(want, c.want, label("all_to_allv over MPI", t, n));
        expect_same(got.host(), c.want, label("all_to_allv", t, n));
        if (varying) continue;
        const Dev equal(Buf(t, n));
        nccl().all_to_all(in.view(), equal.view());
        expect_same(equal.host(), c.want, label("all_to_all", t, n));
      }
}

TEST_F(NcclVsMpi, AllReduceSumAndMax) {
  for (DType t : kDtypes)
    for (std::size_t n : kSizes) {
      Buf a(t, n, [&](std::size_t i) { return sum_value(t, rank(), i, 1); });
      Dev b(a);
      mpi().all_reduce(a.view());
      nccl().all_reduce(b.view());
      expect_same(b.host(), a, label("all_reduce", t, n));

      Buf c(t, n, [&](std::size_t i) { return max_value(rank(), i, 2); });
      Dev d(c);
      mpi().all_reduce_max(c.view());
      nccl().all_reduce_max(d.view());
      expect_same(d.host(), c, label("all_reduce_max", t, n));
    }
}

TEST_F(NcclVsMpi, ReduceScatterOutOfPlaceAndInPlace) {
  for (DType t : kDtypes)
    for (std::size_t shard : kSizes) {
      const std::size_t n = shard * std::size_t(size());
      Buf in(t, n, [&](std::size_t i) { return sum_value(t, rank(), i, 3); }), want(t, shard);
      Dev d_in(in), d_out(Buf(t, shard));
      mpi().reduce_scatter(in.view(), want.view());
      nccl().reduce_scatter(d_in.view(), d_out.view());
      expect_same(d_out.host(), want, label("reduce_scatter", t, n));
      expect_same(d_in.host(), in, label("reduce_scatter leaves its input", t, n));

      // ZeRO's layout: the output is this rank's shard of the input.
      const std::size_t slot = std::size_t(rank()) * shard;
      nccl().reduce_scatter(d_in.view(), d_in.view(slot, shard));
      const Buf full = d_in.host();
      Buf in_shard(t, shard);
      std::memcpy(in_shard.bytes(), full.bytes() + slot * in.esize(), shard * in.esize());
      expect_same(in_shard, want, label("reduce_scatter in place", t, n));
    }
}

TEST_F(NcclVsMpi, AllGatherOutOfPlaceAndInPlace) {
  for (DType t : kDtypes)
    for (std::size_t shard : kSizes) {
      const std::size_t n = shard * std::size_t(size());
      Buf in(t, shard, [&](std::size_t i) { return sum_value(t, rank(), i, 4); }), want(t, n);
      Dev d_in(in), d_out(Buf(t, n));
      mpi().all_gather(in.view(), want.view());
      nccl().all_gather(d_in.view(), d_out.view());
      expect_same(d_out.host(), want, label("all_gather", t, n));

      Buf full(t, n);
      const std::size_t slot = std::size_t(rank()) * shard;
      std::memcpy(full.bytes() + slot * in.esize(), in.bytes(), shard * in.esize());
      Dev d_full(full);
      nccl().all_gather(d_full.view(slot, shard), d_full.view());
      expect_same(d_full.host(), want, label("all_gather in place", t, n));
    }
}

TEST_F(NcclVsMpi, BroadcastAndReduceEveryRoot) {
  for (int root = 0; root < size(); ++root)
    for (DType t : kDtypes)
      for (std::size_t n : kSizes) {
        Buf a(t, n, [&](std::size_t i) { return sum_value(t, rank(), i, 5 + root); });
        Dev b(a);
        mpi().broadcast(a.view(), root);
        nccl().broadcast(b.view(), root);
        expect_same(b.host(), a, label("broadcast", t, n, root));

        // The whole buffer on every rank: the root's sum, the others' data untouched.
        Buf c(t, n, [&](std::size_t i) { return sum_value(t, rank(), i, 6 + root); });
        Dev d(c);
        mpi().reduce(c.view(), root);
        nccl().reduce(d.view(), root);
        expect_same(d.host(), c, label("reduce", t, n, root));
      }
}

TEST_F(NcclVsMpi, EmptyBuffersAndBarrier) {
  Dev empty(Buf(DType::f32, 0));
  nccl().all_reduce(empty.view());
  nccl().all_gather(empty.view(), empty.view());
  nccl().reduce_scatter(empty.view(), empty.view());
  nccl().broadcast(empty.view(), size() - 1);
  nccl().reduce(empty.view(), 0);
  for (int i = 0; i < 5; ++i) nccl().barrier();

  // Nobody leaves the barrier before rank 0 enters it.
  mpi().barrier();
  const auto t0 = std::chrono::steady_clock::now();
  if (rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  nccl().barrier();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.15) << "rank " << rank() << " left the barrier early";
  const auto records = g_world->nccl_ledger.records();
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.back().op, strata::CommOp::barrier);
  EXPECT_EQ(records.back().group, "nccl-world");
  EXPECT_EQ(records.back().group_size, size());
}

// Point to point around the ring, without a deadlock on blocking calls: even ranks send first.
// Two tags, several messages each: each tag's messages in order, received in the order sent.
TEST_F(NcclVsMpi, SendRecvKeepsTagsAndOrder) {
  Dev buf(Buf(DType::f32, 16));
  EXPECT_THROW(nccl().send(buf.view(), rank()), strata::Error);  // to itself: never completes
  EXPECT_THROW(nccl().recv(buf.view(), size()), strata::Error);  // no such rank
  if (size() == 1) return;  // the refusals above are what one rank can check
  const int right = (rank() + 1) % size(), left = (rank() + size() - 1) % size();
  auto message = [](int from, int tag, int k, std::size_t n) {
    return Buf(DType::i64, n,
               [=](std::size_t i) { return from * 100000 + tag * 1000 + k * 10 + long(i % 7); });
  };
  for (std::size_t n : {std::size_t(5), std::size_t(70001)}) {
    auto send_all = [&] {
      for (int k = 0; k < 3; ++k)
        for (int tag : {1, 2}) {
          Dev d(message(rank(), tag, k, n));
          nccl().send(d.view(), right, tag);
        }
    };
    auto recv_all = [&] {
      for (int k = 0; k < 3; ++k)
        for (int tag : {1, 2}) {
          Dev d(Buf(DType::i64, n));
          nccl().recv(d.view(), left, tag);
          expect_same(d.host(), message(left, tag, k, n),
                      "message " + std::to_string(k) + " of tag " + std::to_string(tag) + " x" +
                          std::to_string(n));
        }
    };
    if (rank() % 2 == 0)
      send_all(), recv_all();
    else
      recv_all(), send_all();
  }
}

// Two groups (even and odd world ranks) at once, by ncclCommSplit, against MPI's split.
TEST_F(NcclVsMpi, SubgroupsAllReduce) {
  const int color = world_rank() % 2;
  CommLedger nccl_ledger, mpi_ledger;
  auto nccl_half = strata::nccl::split("half", color, world_rank(), &nccl_ledger);
  auto mpi_half = strata::mpi::split("half", color, world_rank(), &mpi_ledger);
  ASSERT_EQ(nccl_half->size(), mpi_half->size());
  ASSERT_EQ(nccl_half->rank(), mpi_half->rank());
  for (DType t : {DType::f32, DType::i64, DType::u8, DType::bf16})
    for (std::size_t n : {std::size_t(7), std::size_t(4099)}) {
      Buf a(t, n, [&](std::size_t i) { return sum_value(t, world_rank(), i, 8); });
      Dev b(a);
      mpi_half->all_reduce(a.view());
      nccl_half->all_reduce(b.view());
      expect_same(b.host(), a, "half " + std::to_string(color) + ": " + label("all_reduce", t, n));
    }
}

// A host function on another stream that sleeps, then writes the data; an event recorded after
// it. The collective waits for the event, so it reduces the data written, not what was there.
// A host scalar (the gradient norm's sum of squares of the sharded strategies) is staged through
// device memory; a host buffer beyond a few scalars is refused.
TEST_F(NcclVsMpi, AllReduceOfAHostScalar) {
  double sumsq = 1.5 + rank();
  nccl().all_reduce(strata::view(&sumsq, 1));
  EXPECT_EQ(sumsq, 1.5 * size() + size() * (size() - 1) / 2.0);
  std::vector<double> many(64, 1.0);
  EXPECT_THROW(nccl().all_reduce(strata::view(many.data(), many.size())), strata::Error);
}

TEST_F(NcclVsMpi, CollectiveWaitsForTheComputeEvent) {
  constexpr std::size_t n = 1000;
  Buf want(DType::f32, n, [&](std::size_t i) { return sum_value(DType::f32, rank(), i, 9); });
  Dev dev(Buf(DType::f32, n, [](std::size_t) { return 0; }));
  cudaStream_t compute = nullptr;
  cudaEvent_t produced = nullptr;
  STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  STRATA_CUDA_CHECK(cudaEventCreate(&produced));
  STRATA_CUDA_CHECK(cudaLaunchHostFunc(
      compute, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); },
      nullptr));
  STRATA_CUDA_CHECK(
      cudaMemcpyAsync(dev.view().data, want.bytes(), n * 4, cudaMemcpyHostToDevice, compute));
  STRATA_CUDA_CHECK(cudaEventRecord(produced, compute));
  auto& group = dynamic_cast<NcclGroup&>(nccl());
  group.set_compute_event(produced);
  const double t0 = strata::now();
  group.all_reduce(dev.view());
  const double host_seconds = strata::now() - t0;
  group.set_compute_event(nullptr);
  mpi().all_reduce(want.view());
  expect_same(dev.host(), want, "all_reduce after the compute event");
  // The ledger's interval is the one the events timed: the wait for the compute is not comm.
  const strata::CommRecord call = g_world->nccl_ledger.records().back();
  EXPECT_GE(host_seconds, 0.29);
  EXPECT_LT(call.seconds(), host_seconds - 0.2);
  EXPECT_GE(call.t0, t0 + 0.2);
  STRATA_CUDA_CHECK(cudaStreamDestroy(compute));
  STRATA_CUDA_CHECK(cudaEventDestroy(produced));
}

TEST_F(NcclVsMpi, BadArgumentsThrow) {
  Dev buf(Buf(DType::f32, 8));
  EXPECT_THROW(nccl().send(buf.view(), size()), strata::Error);
  EXPECT_THROW(nccl().reduce(buf.view(), -1), strata::Error);
  try {
    nccl().broadcast(buf.view(), size());  // Group's check, before NCCL is called
    ADD_FAILURE() << "a broadcast from root == size did not throw";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("broadcast root"), std::string::npos) << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
  std::vector<float> host(8, 1.0f);  // NCCL moves device memory only: its own refusal
  try {
    nccl().broadcast(strata::view(host.data(), host.size()), 0);
    ADD_FAILURE() << "a broadcast of host memory did not throw";
  } catch (const strata::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("ncclBroadcast("), std::string::npos) << what;
    EXPECT_NE(what.find("is not device memory"), std::string::npos) << what;
    EXPECT_FALSE(e.hint().empty());
  }
  Dev wrong(Buf(DType::f32, 8 * std::size_t(size()) + 1));
  EXPECT_THROW(nccl().all_gather(buf.view(), wrong.view()), strata::Error);
  nccl().barrier();  // the group is still usable afterwards
}

// Tags match as with MPI: rank 0 sends tag 1 then tag 2; rank 1 receives tag 2 first (tag 1's
// message, ahead of it, goes to a stash) and then tag 1, each with its own data. A receive of
// another size than its message's is refused (the group aborted).
TEST_F(NcclVsMpi, TagsMatchInAnyOrderAndSizesAreChecked) {
  CommLedger ledger;
  auto pair = strata::nccl::split("pair", world_rank() < 2 ? 0 : 1, world_rank(), &ledger);
  if (world_rank() >= 2 || pair->size() < 2) return;
  Buf one(DType::i32, 4, [](std::size_t i) { return long(i); });
  Buf two(DType::i32, 6, [](std::size_t i) { return long(100 + i); });
  if (pair->rank() == 0) {
    Dev a(one), b(two), c(one);
    pair->send(a.view(), 1, /*tag=*/1);
    pair->send(b.view(), 1, /*tag=*/2);
    pair->send(c.view(), 1, /*tag=*/1);
    return;
  }
  Dev got_two(Buf(DType::i32, 6)), got_one(Buf(DType::i32, 4));
  pair->recv(got_two.view(), 0, /*tag=*/2);
  pair->recv(got_one.view(), 0, /*tag=*/1);
  expect_same(got_two.host(), two, "tag 2, received first");
  expect_same(got_one.host(), one, "tag 1, from the stash");
  Dev wrong(Buf(DType::i32, 5));
  try {
    pair->recv(wrong.view(), 0, /*tag=*/1);
    ADD_FAILURE() << "a recv of 20 bytes took a 16-byte message";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "recv (tag 1, 20 bytes) from rank 0: its message of tag 1 is 16 bytes"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(dynamic_cast<NcclGroup&>(*pair).aborted());
  EXPECT_THROW(pair->barrier(), strata::Error);
}

// The last rank's link fails: it throws and aborts; every other rank's all_reduce, which would
// wait for it forever, ends with ncclRemoteError. All within seconds; the world group still works.
TEST_F(NcclVsMpi, FailedRankEndsEveryWait) {
  CommLedger ledger;
  auto group = strata::nccl::split("doomed", 0, world_rank(), &ledger);
  auto& g = dynamic_cast<NcclGroup&>(*group);
  if (g.rank() == g.size() - 1)
    ASSERT_EQ(ncclStandinFailNext(g.comm(), ncclSystemError), ncclSuccess);
  Dev buf(Buf(DType::f32, 100));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    group->all_reduce(buf.view());
    ADD_FAILURE() << "the all_reduce with a failed rank returned";
  } catch (const strata::Error& e) {
    const std::string what = e.what();
    const bool failed_here = g.rank() == g.size() - 1;
    EXPECT_NE(what.find(failed_here ? "unhandled system error" : "remote process exited"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("the communicator was aborted"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_TRUE(g.aborted());
  try {
    group->all_reduce(buf.view());
    ADD_FAILURE() << "an aborted group took another call";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("aborted after an earlier error"), std::string::npos);
  }
  nccl().barrier();
}

// Last (the flag stays set): the stop flag ends a wait that nothing else would end, here a
// collective behind a compute event that completes only when the test lets it.
std::atomic<bool> g_release_compute{false};
TEST_F(NcclVsMpi, StopFlagEndsAWaitLast) {
  CommLedger ledger;
  auto group = strata::nccl::split("stopped", 0, world_rank(), &ledger);
  auto& g = dynamic_cast<NcclGroup&>(*group);
  cudaStream_t compute = nullptr;
  cudaEvent_t never = nullptr;
  STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  STRATA_CUDA_CHECK(cudaEventCreate(&never));
  STRATA_CUDA_CHECK(cudaLaunchHostFunc(
      compute,
      [](void*) {
        while (!g_release_compute) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      },
      nullptr));
  STRATA_CUDA_CHECK(cudaEventRecord(never, compute));
  g.set_compute_event(never);
  std::thread stopper([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    strata::request_comm_stop();
  });
  Dev buf(Buf(DType::f32, 10));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    group->all_reduce(buf.view());
    ADD_FAILURE() << "the all_reduce returned";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce stopped on NCCL group stopped"),
              std::string::npos)
        << e.what();
  }
  stopper.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_TRUE(g.aborted());
  g_release_compute = true;
  group.reset();
  STRATA_CUDA_CHECK(cudaStreamDestroy(compute));
  STRATA_CUDA_CHECK(cudaEventDestroy(never));
}

// Non-zero ranks: only failures, with the rank in front.

}  // namespace

int main(int argc, char** argv) {
  return conformance::run_mpi_tests(argc, argv, [](int rank) {
    strata::nccl::register_transport();  // the world group comes through the registry
    World world;
    world.nccl = strata::split_group("nccl", "nccl-world", 0, rank, &world.nccl_ledger);
    world.mpi = strata::mpi::split("world", 0, rank, &world.mpi_ledger);
    g_world = &world;
    const int rc = RUN_ALL_TESTS();
    g_world = nullptr;
    return rc;
  });
}
