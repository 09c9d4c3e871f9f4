// The NCCL transport as a 1-rank MPI program (singleton MPI_Init, no launcher): a 1-rank NCCL
// communicator on GPU 0, every operation on device buffers against the expected values, the
// ledger's records, the GPU-event timing and the error path.
//
// With one rank every collective is the identity (all_reduce sum or max of x is x, all_gather and
// reduce_scatter copy, broadcast and reduce leave the root's buffer as it is), so a wrong count,
// dtype, offset or in-place form shows up as changed or missing elements. send/recv need a peer:
// with one rank only the rejection of a send to itself is checked.
//
// Every GPU test skips (visibly, by name) on a machine without a CUDA device; the version string
// and the error message format are checked everywhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/device.hpp"
#include "backends/cuda/nccl_transport.hpp"
#include "strata/comm.hpp"
#include "strata/types.hpp"

namespace {

using strata::BufferView;
using strata::CommLedger;
using strata::CommOp;
using strata::DType;
using strata::Group;
using strata::nccl::NcclGroup;

// A device copy of a host vector, freed at scope exit.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : count_(host.size()) {
    STRATA_CUDA_CHECK(cudaMalloc(&data_, bytes()));
    STRATA_CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
    // A pageable copy may return before its DMA ends, and the group's stream is non-blocking.
    STRATA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~DeviceBuffer() { (void)cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  std::size_t bytes() const { return count_ * sizeof(T); }
  // Elements [offset, offset + count) as a BufferView.
  BufferView view(DType dtype, std::size_t offset = 0, std::size_t count = SIZE_MAX) const {
    return {static_cast<T*>(data_) + offset, count == SIZE_MAX ? count_ - offset : count, dtype};
  }
  std::vector<T> host() const {
    std::vector<T> out(count_);
    STRATA_CUDA_CHECK(cudaMemcpy(out.data(), data_, bytes(), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  void* data_ = nullptr;
  std::size_t count_;
};

template <class T>
std::vector<T> pattern(std::size_t n) {  // distinct, sign-mixed where T allows, exact in T
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(T(i % 251) - T(100));
  return v;
}

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (strata::cuda::cuda_device_count() == 0)
      GTEST_FAIL() << "no CUDA device: "
                   << ::testing::UnitTest::GetInstance()->current_test_info()->name()
                   << " needs a GPU";
    STRATA_CUDA_CHECK(cudaSetDevice(0));
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    group_ = strata::nccl::split("dp", /*color=*/0, /*key=*/0, &ledger_, stream_);
    nccl_ = dynamic_cast<NcclGroup*>(group_.get());
    ASSERT_NE(nccl_, nullptr);
    ASSERT_EQ(group_->size(), 1);
    ASSERT_EQ(group_->rank(), 0);
  }
  void TearDown() override {
    group_.reset();
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  // The ledger's last record: op and bytes (nccl-tests sizes), group name and size.
  void expect_last_record(CommOp op, std::uint64_t bytes) {
    const auto records = ledger_.records();
    ASSERT_FALSE(records.empty());
    EXPECT_EQ(records.back().op, op) << strata::op_name(records.back().op);
    EXPECT_EQ(records.back().bytes, bytes) << strata::op_name(op);
    EXPECT_EQ(records.back().group, "dp");
    EXPECT_EQ(records.back().group_size, 1);
    EXPECT_GE(records.back().t1, records.back().t0);
    // >= 0 only: on one rank an in-place call enqueues no GPU work at all.
    EXPECT_GE(nccl_->last_gpu_seconds(), 0.0) << strata::op_name(op);
  }

  CommLedger ledger_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Group> group_;
  NcclGroup* nccl_ = nullptr;
};

// ---- Without a GPU ------------------------------------------------------------------------------

TEST(NcclLibrary, VersionString) {
  const std::string v = strata::nccl::nccl_version();
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v.rfind("2.", 0), 0u) << v;
  EXPECT_EQ(v, std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
                   std::to_string(NCCL_PATCH))
      << "the loaded libnccl differs from the nccl.h strata was built with";
}

TEST(NcclLibrary, ErrorMessageNamesRankCallAndLine) {
  try {
    STRATA_NCCL_CHECK(ncclInvalidArgument);
    FAIL() << "no exception";
  } catch (const strata::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("rank 0: ncclInvalidArgument failed at ", 0), 0u) << what;
    EXPECT_NE(what.find("test_nccl.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find(ncclGetErrorString(ncclInvalidArgument)), std::string::npos) << what;
    EXPECT_NE(e.hint().find("NCCL_DEBUG=INFO"), std::string::npos) << e.hint();
  }
}

// ---- On GPU 0, one rank -------------------------------------------------------------------------

TEST_F(NcclTest, AllReduceSumAndMaxEveryDtype) {
  constexpr std::size_t n = 1000;
  DeviceBuffer<float> f32(pattern<float>(n));
  DeviceBuffer<double> f64(pattern<double>(n));
  DeviceBuffer<std::int32_t> i32(pattern<std::int32_t>(n));
  DeviceBuffer<std::int64_t> i64(pattern<std::int64_t>(n));
  DeviceBuffer<std::uint8_t> u8(pattern<std::uint8_t>(n));

  group_->all_reduce(f32.view(DType::f32));
  expect_last_record(CommOp::all_reduce, n * 4);
  group_->all_reduce_max(f32.view(DType::f32));
  expect_last_record(CommOp::all_reduce, n * 4);
  group_->all_reduce(f64.view(DType::f64));
  expect_last_record(CommOp::all_reduce, n * 8);
  group_->all_reduce(i32.view(DType::i32));
  expect_last_record(CommOp::all_reduce, n * 4);
  group_->all_reduce_max(i64.view(DType::i64));
  expect_last_record(CommOp::all_reduce, n * 8);
  group_->all_reduce(u8.view(DType::u8));
  expect_last_record(CommOp::all_reduce, n);

  EXPECT_EQ(f32.host(), pattern<float>(n));
  EXPECT_EQ(f64.host(), pattern<double>(n));
  EXPECT_EQ(i32.host(), pattern<std::int32_t>(n));
  EXPECT_EQ(i64.host(), pattern<std::int64_t>(n));
  EXPECT_EQ(u8.host(), pattern<std::uint8_t>(n));
  EXPECT_EQ(ledger_.records().size(), 6u);
}

TEST_F(NcclTest, ReduceScatterAndAllGatherOutOfPlace) {
  constexpr std::size_t n = 4096;
  DeviceBuffer<float> in(pattern<float>(n));
  DeviceBuffer<float> out(std::vector<float>(n, -1.0f));
  group_->reduce_scatter(in.view(DType::f32), out.view(DType::f32));
  expect_last_record(CommOp::reduce_scatter, n * 4);  // the full (n x shard) size
  EXPECT_EQ(out.host(), pattern<float>(n));

  DeviceBuffer<float> gathered(std::vector<float>(n, -1.0f));
  group_->all_gather(out.view(DType::f32), gathered.view(DType::f32));
  expect_last_record(CommOp::all_gather, n * 4);
  EXPECT_EQ(gathered.host(), pattern<float>(n));
}

TEST_F(NcclTest, ReduceScatterAndAllGatherInPlace) {
  // ZeRO's layout: this rank's shard is its slot of the full buffer (rank 0: the first slot, which
  // with one rank is the whole buffer).
  constexpr std::size_t n = 4096;
  DeviceBuffer<float> full(pattern<float>(n));
  const std::size_t shard = n / std::size_t(group_->size());
  const std::size_t slot = std::size_t(group_->rank()) * shard;
  group_->reduce_scatter(full.view(DType::f32), full.view(DType::f32, slot, shard));
  expect_last_record(CommOp::reduce_scatter, n * 4);
  group_->all_gather(full.view(DType::f32, slot, shard), full.view(DType::f32));
  expect_last_record(CommOp::all_gather, n * 4);
  EXPECT_EQ(full.host(), pattern<float>(n));
}

TEST_F(NcclTest, BroadcastAndReduceAreIdentityOnTheRoot) {
  constexpr std::size_t n = 777;
  DeviceBuffer<double> buf(pattern<double>(n));
  group_->broadcast(buf.view(DType::f64), /*root=*/0);
  expect_last_record(CommOp::broadcast, n * 8);
  group_->reduce(buf.view(DType::f64), /*root=*/0);
  expect_last_record(CommOp::reduce, n * 8);
  EXPECT_EQ(buf.host(), pattern<double>(n));
}

TEST_F(NcclTest, BarrierAndGpuTiming) {
  group_->barrier();
  expect_last_record(CommOp::barrier, 0);

  // A 64 MiB out-of-place all_gather (on one rank a device-to-device copy, so real GPU work): the
  // event pair measures it, and the host-measured call, which waits for the stream, covers it.
  constexpr std::size_t n = std::size_t(16) << 20;
  DeviceBuffer<float> in(std::vector<float>(n, 1.5f));
  DeviceBuffer<float> out(std::vector<float>(n, 0.0f));
  group_->all_gather(in.view(DType::f32), out.view(DType::f32));
  expect_last_record(CommOp::all_gather, n * 4);
  EXPECT_GT(nccl_->last_gpu_seconds(), 0.0);
  EXPECT_GE(ledger_.records().back().seconds() * 1.01 + 1e-5, nccl_->last_gpu_seconds());
  EXPECT_EQ(out.host(), std::vector<float>(n, 1.5f));
}

// On one GPU the exchange is a grouped ncclSend / ncclRecv to itself (NCCL allows that inside a
// group, where a lone send to itself would never complete); ranks apart are the stand-in's.
TEST_F(NcclTest, AllToAllSendsItsOwnBlockToItself) {
  constexpr std::size_t n = 4099;
  DeviceBuffer<float> in(pattern<float>(n));
  DeviceBuffer<float> out(std::vector<float>(n, -1.0f));
  const std::size_t ranks = std::size_t(group_->size());
  const std::vector<std::size_t> counts(ranks, n / ranks);
  group_->all_to_allv(in.view(DType::f32), counts, out.view(DType::f32), counts);
  expect_last_record(CommOp::all_to_all, n / ranks * ranks * 4);
  std::vector<float> want = pattern<float>(n);
  want.resize(n / ranks * ranks);
  std::vector<float> got = out.host();
  got.resize(want.size());
  EXPECT_EQ(got, want);
}

TEST_F(NcclTest, SendRecvNeedAPeer) {
  DeviceBuffer<float> buf(pattern<float>(16));
  // A blocking send to itself would never complete: rejected before NCCL is called.
  EXPECT_THROW(nccl_->send(buf.view(DType::f32), 0), strata::Error);
  EXPECT_THROW(nccl_->recv(buf.view(DType::f32), 1), strata::Error);  // no rank 1
  // A transfer between two ranks is the conformance test's (nccl.standin.np2..5).
}

TEST_F(NcclTest, NcclErrorsBecomeStrataErrors) {
  DeviceBuffer<float> buf(pattern<float>(16));
  try {
    group_->broadcast(buf.view(DType::f32), /*root=*/5);  // no rank 5 in a 1-rank group
    FAIL() << "no exception";
  } catch (const strata::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("rank 0: ncclBroadcast(", 0), 0u) << what;
    EXPECT_NE(what.find("nccl_transport.cpp:"), std::string::npos) << what;
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
