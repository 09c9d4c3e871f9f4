// The CUDA emulator's stream capture (tests/cuda_emu/src/graphs.cpp): the rules of capture it
// enforces, as CUDA states them, so that a --cuda-graphs step that would fail on a GPU fails here.
// Thread-local mode refuses unsafe calls on the capturing thread only, global mode on every
// thread, relaxed mode on none; a capturing stream cannot be synchronised in any mode; a refused
// call invalidates the capture, whose end then gives no graph.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace {

struct CapturedStream {
  cudaStream_t stream = nullptr;
  CapturedStream() { EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), 0); }
  ~CapturedStream() { cudaStreamDestroy(stream); }
};

// cudaMalloc's result when called from another thread than the capture's.
cudaError_t malloc_elsewhere() {
  cudaError_t err = cudaSuccess;
  std::thread([&] {
    void* p = nullptr;
    err = cudaMalloc(&p, 64);
    if (err == cudaSuccess) cudaFree(p);
  }).join();
  return err;
}

// Ends the capture of `s`, destroying any graph; returns the end's result.
cudaError_t end_capture(cudaStream_t s) {
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(s, &graph);
  if (err != cudaSuccess) EXPECT_EQ(graph, nullptr);
  if (graph) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  return err;
}

}  // namespace

TEST(CudaEmuGraphs, ThreadLocalCaptureRefusesUnsafeCallsOnItsOwnThreadOnly) {
  CapturedStream c;
  ASSERT_EQ(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(malloc_elsewhere(), cudaSuccess);
  cudaStreamCaptureStatus status{};
  ASSERT_EQ(cudaStreamIsCapturing(c.stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
  ASSERT_EQ(cudaStreamIsCapturing(c.stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(end_capture(c.stream), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaMalloc(&p, 64), cudaSuccess);  // the capture is over
  cudaFree(p);
}

TEST(CudaEmuGraphs, GlobalCaptureRefusesUnsafeCallsOnEveryThread) {
  CapturedStream c;
  ASSERT_EQ(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(malloc_elsewhere(), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(end_capture(c.stream), cudaErrorStreamCaptureInvalidated);
}

TEST(CudaEmuGraphs, RelaxedCaptureAllowsUnsafeCallsButNotSynchronisingTheStream) {
  CapturedStream c;
  ASSERT_EQ(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(c.stream), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(end_capture(c.stream), cudaErrorStreamCaptureInvalidated);
  cudaFree(p);
}

// The synchronous copy and the legacy default stream are refused on the capturing thread; a
// thread-local capture cannot be ended from another thread.
TEST(CudaEmuGraphs, SynchronousWorkAndForeignEndsAreRefused) {
  CapturedStream c;
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 16), cudaSuccess);
  float h[4] = {};
  ASSERT_EQ(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaError_t foreign = cudaSuccess;
  std::thread([&] {
    cudaGraph_t g = nullptr;
    foreign = cudaStreamEndCapture(c.stream, &g);
  }).join();
  EXPECT_EQ(foreign, cudaErrorStreamCaptureWrongThread);
  EXPECT_EQ(cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(end_capture(c.stream), cudaErrorStreamCaptureInvalidated);
  ASSERT_EQ(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(d, 0, 16, nullptr), cudaErrorStreamCaptureImplicit);
  EXPECT_EQ(end_capture(c.stream), cudaErrorStreamCaptureInvalidated);
  cudaFree(d);
}

// A graph replays what was captured, in order, at each launch and only then: a memset and a copy,
// with graph memory that outlives the capture's free for every launch.
TEST(CudaEmuGraphs, AGraphReplaysItsCapturedWorkAtEachLaunch) {
  CapturedStream c;
  void* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 8), cudaSuccess);
  ASSERT_EQ(cudaMemset(out, 0, 8), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  void* scratch = nullptr;
  ASSERT_EQ(cudaMallocAsync(&scratch, 8, c.stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(scratch, 7, 8, c.stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out, scratch, 8, cudaMemcpyDeviceToDevice, c.stream), cudaSuccess);
  ASSERT_EQ(cudaFreeAsync(scratch, c.stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(c.stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);  // the executable keeps what it needs
  unsigned char host[8];
  ASSERT_EQ(cudaMemcpy(host, out, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::vector<unsigned char>(host, host + 8), std::vector<unsigned char>(8, 0));
  for (int launch = 0; launch < 2; ++launch) {
    ASSERT_EQ(cudaMemset(out, 0, 8), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, c.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(c.stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host, out, 8, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::vector<unsigned char>(host, host + 8), std::vector<unsigned char>(8, 7));
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  cudaFree(out);
}
