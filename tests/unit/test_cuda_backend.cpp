// The CUDA backend of a run (core/src/backends/cuda/backend.hpp) on the GPU, or on the CUDA
// emulator (test_cuda_backend_emu): a ledger of Device::cuda allocates from the stream-ordered
// pool, zero-filled, with the same per-tag bytes as on the host; the device peak covers them;
// copies between host and device; device_ops() and device_kernels() are the backend's; memory of a
// device whose backend is not open is refused; work captured into a graph runs at each launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "backends/backend.hpp"
#include "backends/cuda/backend.hpp"
#include "comm/idle_clock.hpp"
#include "cuda_test.hpp"
#include "strata/comm.hpp"
#include "strata/memory.hpp"

using namespace strata;

namespace {

// The process's backend, opened once (as a run does) for GPU 0.
cuda::CudaBackend& backend() {
  static DeviceBackend& b = []() -> DeviceBackend& {
    cuda::register_backend();
    return open_backend(Device::cuda, BackendRequest{0, 1});
  }();
  return static_cast<cuda::CudaBackend&>(b);
}

std::vector<float> to_host(const Buffer<float>& b) {
  std::vector<float> h(b.size());
  copy_bytes(Device::cuda, h.data(), b.data(), b.bytes());
  return h;
}

}  // namespace

TEST(CudaBackend, LedgerBuffersLiveOnTheDeviceZeroed) {
  STRATA_REQUIRE_GPU();
  cuda::CudaBackend& gpu = backend();
  MemoryLedger ledger(Device::cuda);
  {
    Buffer<float> params(ledger, MemTag::params, 1000);
    DeviceBuffer grads(ledger, MemTag::grads, DType::bf16, 3001);
    EXPECT_EQ(params.device(), Device::cuda);
    EXPECT_EQ(grads.view().device, Device::cuda);
    EXPECT_EQ(ledger.current(MemTag::params), 4000u);
    EXPECT_EQ(ledger.current(MemTag::grads), 6002u);
    cudaPointerAttributes where{};
    STRATA_CUDA_CHECK(cudaPointerGetAttributes(&where, params.data()));
    EXPECT_EQ(where.type, cudaMemoryTypeDevice);
    EXPECT_EQ(to_host(params), std::vector<float>(1000, 0.0f));  // zeroed in stream order
    // Through the backend's ops, as a plugin would: fill, then read back.
    device_ops(Device::cuda).fill(params.view(), 2.5);
    EXPECT_EQ(to_host(params), std::vector<float>(1000, 2.5f));
    EXPECT_GE(gpu.peak_device_bytes(), ledger.total_peak());
  }
  EXPECT_EQ(ledger.total(), 0u);
  EXPECT_EQ(ledger.total_peak(), 10002u);
  EXPECT_EQ(&device_ops(Device::cuda), &gpu.ops());
  EXPECT_EQ(&device_kernels(Device::cuda), &gpu.kernels());
  EXPECT_EQ(&device_kernels(Device::cpu), &cpu_kernels());
}

TEST(CudaBackend, CopiesBetweenHostAndDevice) {
  STRATA_REQUIRE_GPU();
  backend();
  MemoryLedger ledger(Device::cuda);
  Buffer<float> a(ledger, MemTag::workspace, 513), b(ledger, MemTag::workspace, 513);
  const std::vector<float> values = random_floats(513, 7);
  copy_bytes(Device::cuda, a.data(), values.data(), a.bytes());  // host to device
  copy_bytes(Device::cuda, b.data(), a.data(), a.bytes());       // device to device
  EXPECT_EQ(to_host(b), values);                                 // device to host
}

// CPU offload's host side on a GPU run: a host-tag buffer is page-locked host memory
// (cudaMallocHost), zeroed, counted under its tag and not in the device's total, and copies to
// and from the device through copy_across.
TEST(CudaBackend, OffloadBuffersArePinnedHostMemory) {
  STRATA_REQUIRE_GPU();
  backend();
  MemoryLedger ledger(Device::cuda);
  const float* first = nullptr;
  {
    Buffer<float> host(ledger, MemTag::offload, 300), dev(ledger, MemTag::optimizer, 300);
    EXPECT_EQ(host.device(), Device::cpu);
    cudaPointerAttributes where{};
    STRATA_CUDA_CHECK(cudaPointerGetAttributes(&where, host.data()));
    EXPECT_EQ(where.type, cudaMemoryTypeHost);
    EXPECT_EQ(std::vector<float>(host.data(), host.data() + 300), std::vector<float>(300, 0.0f));
    EXPECT_EQ(ledger.current(MemTag::offload), 1200u);
    EXPECT_EQ(ledger.total(), 1200u);  // the device's: the optimizer buffer only
    const std::vector<float> values = random_floats(300, 9);
    std::copy(values.begin(), values.end(), host.data());
    copy_across(dev.view(), host.view());
    std::fill(host.data(), host.data() + 300, 0.0f);
    copy_across(host.view(), dev.view());
    EXPECT_EQ(std::vector<float>(host.data(), host.data() + 300), values);
    first = host.data();
  }
  EXPECT_EQ(ledger.current(MemTag::offload), 0u);
  // Released blocks are kept for the next of their size (pinning costs more than the copies):
  // the same block again, zeroed.
  Buffer<float> again(ledger, MemTag::offload, 300);
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(std::vector<float>(again.data(), again.data() + 300), std::vector<float>(300, 0.0f));
}

TEST(CudaBackend, FreedMemoryGoesBackToThePool) {
  STRATA_REQUIRE_GPU();
  cuda::CudaBackend& gpu = backend();
  MemoryLedger ledger(Device::cuda);
  for (int round = 0; round < 3; ++round) {  // the same bytes again: the pool's peak stays
    Buffer<float> big(ledger, MemTag::activations, std::size_t(1) << 20);
    gpu.synchronize();
  }
  const std::uint64_t peak = gpu.peak_device_bytes();
  {
    Buffer<float> again(ledger, MemTag::activations, std::size_t(1) << 20);
    gpu.synchronize();
  }
  EXPECT_EQ(gpu.peak_device_bytes(), peak);
  EXPECT_GE(peak, std::uint64_t(4) << 20);
}

// An op called in work on a comm stream has finished when it returns (as on the CPU), even with
// the compute stream busy: the work's next call, here a copy to the host on another stream, sees
// its result.
TEST(CudaBackend, OpsOnACommStreamFinishBeforeTheyReturn) {
  STRATA_REQUIRE_GPU();
  cuda::CudaBackend& gpu = backend();
  MemoryLedger ledger(Device::cuda);
  Buffer<float> a(ledger, MemTag::workspace, 256), b(ledger, MemTag::workspace, 256);
  const std::vector<float> values = random_floats(256, 11);
  copy_bytes(Device::cuda, a.data(), values.data(), a.bytes());
  STRATA_CUDA_CHECK(cudaLaunchHostFunc(
      gpu.stream(), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); },
      nullptr));
  CommLedger comm;
  CommStream stream(comm);
  std::vector<float> seen(256, -1.0f);
  stream
      .enqueue([&] {
        device_ops(Device::cuda).copy(b.view(), a.view());
        STRATA_CUDA_CHECK(cudaMemcpy(seen.data(), b.data(), b.bytes(), cudaMemcpyDeviceToHost));
      })
      .wait();
  EXPECT_EQ(seen, values);
  // The wait stays pending on the backend's idle clock until a step resolves it; the ledger drops
  // it as it goes (a later test in this process would otherwise record into this frame's ledger).
}

// The CPU ledger and its buffers need no backend; device memory in a process whose backend is not
// open (ctest runs each test in a process of its own) is refused, naming what is missing.
TEST(CudaBackend, DeviceMemoryNeedsAnOpenBackend) {
  MemoryLedger host;
  Buffer<float> h(host, MemTag::workspace, 10);
  EXPECT_EQ(h.device(), Device::cpu);
  h[9] = 1.0f;  // host memory: element access is fine
  EXPECT_EQ(h.span()[9], 1.0f);
  if (opened_backend(Device::cuda)) GTEST_SKIP() << "a backend is open in this process already";
  MemoryLedger gpu(Device::cuda);
  try {
    Buffer<float> d(gpu, MemTag::workspace, 10);
    ADD_FAILURE() << "device memory without a backend";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no cuda backend is open"), std::string::npos) << e.what();
  }
  EXPECT_EQ(gpu.total(), 0u);
}

// Exposed comm on a GPU (comm/idle_clock.hpp): the compute thread's wait counts as idle compute
// only from when the compute stream had finished its queued work. Idle stream: all of the host's
// wait; a stream busy past the wait's end: none of it.
TEST(CudaBackend, IdleTimeOfAWaitIsTheComputeStreamsNotTheHosts) {
  STRATA_REQUIRE_GPU();
  cuda::CudaBackend& gpu = backend();
  const auto idle_of_a_wait = [&](double stream_busy_s) {
    CommLedger ledger;
    if (stream_busy_s > 0) {
      static double seconds;
      seconds = stream_busy_s;
      STRATA_CUDA_CHECK(cudaLaunchHostFunc(
          gpu.stream(),
          [](void*) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); },
          nullptr));
    }
    const WaitStart start = begin_wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    end_wait(ledger, start);
    EXPECT_TRUE(ledger.waits(-1).empty()) << "recorded before the stream passed its marks";
    gpu.synchronize();
    resolve_idle_waits();
    const auto waits = ledger.waits(-1);
    EXPECT_EQ(waits.size(), 1u);
    return waits.empty() ? -1.0 : waits[0].second - waits[0].first;
  };
  // Idle stream: most of the host's 40 ms (the stream's mark at the wait's start can land a few
  // ms after it on a loaded machine: 34.9 ms measured under ASan on 2 cores, 2026-12-01), far
  // from the busy stream's none.
  EXPECT_GE(idle_of_a_wait(0), 0.025);
  EXPECT_LT(idle_of_a_wait(0.4), 0.005);  // busy 0.4 s, the host waited 0.04 s of it
}

// --cuda-graphs' mechanism: work captured on the compute stream runs only when the graph is
// launched, each launch on the memory the capture saw (here y += 2 x, three launches: y = 6 x +
// its start), with a stream-ordered scratch block the capture allocated and freed inside.
TEST(CudaBackend, CapturedWorkRunsAtEachLaunch) {
  STRATA_REQUIRE_GPU();
  cuda::CudaBackend& gpu = backend();
  MemoryLedger ledger(Device::cuda);
  Buffer<float> x(ledger, MemTag::workspace, 1000), y(ledger, MemTag::workspace, 1000);
  const std::vector<float> xs = random_floats(1000, 3), ys = random_floats(1000, 4);
  copy_bytes(Device::cuda, x.data(), xs.data(), x.bytes());
  copy_bytes(Device::cuda, y.data(), ys.data(), y.bytes());
  DeviceOps& ops = device_ops(Device::cuda);
  std::unique_ptr<StreamGraph> graph = gpu.capture([&] {
    void* scratch = nullptr;
    STRATA_CUDA_CHECK(cudaMallocAsync(&scratch, x.bytes(), gpu.stream()));
    const BufferView twice{scratch, x.size(), DType::f32, Device::cuda};
    ops.copy(twice, x.view());
    ops.scale(twice, 2.0);
    ops.axpy(y.view(), 1.0, twice);
    STRATA_CUDA_CHECK(cudaFreeAsync(scratch, gpu.stream()));
  });
  EXPECT_EQ(to_host(y), ys) << "captured work ran during the capture";
  for (int i = 0; i < 3; ++i) graph->launch();
  const std::vector<float> got = to_host(y);
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], ys[i] + 6.0f * xs[i], 1e-5f * (1 + std::fabs(ys[i] + 6 * xs[i]))) << i;
}

// A host synchronisation cannot be captured: the capture fails with an Error that names the call
// and says what to do, and the stream works as before afterwards.
TEST(CudaBackend, CaptureRefusesAHostSynchronisation) {
  STRATA_REQUIRE_GPU();
  cuda::CudaBackend& gpu = backend();
  MemoryLedger ledger(Device::cuda);
  Buffer<float> x(ledger, MemTag::workspace, 100);
  try {
    gpu.capture([&] {
      device_ops(Device::cuda).fill(x.view(), 1.0);
      gpu.synchronize();
    });
    ADD_FAILURE() << "a synchronisation was captured";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cudaStreamSynchronize"), std::string::npos) << what;
    EXPECT_NE(e.hint().find("--cuda-graphs"), std::string::npos) << e.hint();
  }
  device_ops(Device::cuda).fill(x.view(), 3.0);
  EXPECT_EQ(to_host(x), std::vector<float>(100, 3.0f));
}
