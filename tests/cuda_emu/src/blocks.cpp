// The CUDA emulator's block runner: every CUDA thread of a block on its own host thread.
//
// A pool of host threads, grown to the largest block seen and reused by every launch (creating
// 1024 threads per block would dominate the run time). For one launch the first nthreads workers
// run the grid's blocks one after another: each runs the kernel body for its threadIdx, leaves the
// block's barriers (an exited CUDA thread no longer holds back __syncthreads), and meets the others
// at the end-of-block barrier, whose completion step sets up the next block: fresh barriers and
// dynamic shared memory refilled with 0xFF, so a kernel reading shared memory it did not write
// this block sees NaN.
#include <barrier>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "cuda_emu/kernel.hpp"
#include "internal.hpp"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace strata_emu {
namespace {

struct Warp {
  std::optional<std::barrier<>> barrier;
  // Two slot sets used in turn: a lane writes the next shuffle's set while slower lanes may still
  // read this one's, and the barrier of that next shuffle keeps it from coming round again before
  // every lane has read. One barrier per shuffle instead of two.
  std::uint64_t slots[2][32] = {};
  // Which shuffle of the block (1, 2, ...) each slot holds: a lane that exited or diverged has
  // not published the reader's shuffle.
  std::uint32_t numbers[2][32] = {};
  std::uint32_t lanes = 0;  // lanes that exist in this block
};

struct Grid;

// The end-of-block barrier's completion: runs on one thread while all others wait.
struct NextBlock {
  Grid* grid;
  void operator()() noexcept;
};

struct Grid {
  Grid(const LaunchConfig& c, const std::function<void()>& b)
      : config(c),
        body(b),
        nthreads(c.block.x * c.block.y * c.block.z),
        nblocks(std::uint64_t(c.grid.x) * c.grid.y * c.grid.z),
        warps(std::make_unique<Warp[]>((nthreads + 31) / 32)),
        smem(c.smem > 0 ? std::make_unique<std::byte[]>(c.smem) : nullptr),
        block_end(nthreads, NextBlock{this}),
        active(nthreads) {
    reset_block();
  }

  // Barriers and shared memory for the block `block` (no thread is inside the block now).
  void reset_block() {
    sync.emplace(nthreads);
    for (unsigned w = 0; w * 32 < nthreads; ++w) {
      const unsigned lanes = std::min(32u, nthreads - w * 32);
      warps[w].barrier.emplace(lanes);
      warps[w].lanes = lanes == 32 ? ~0u : (1u << lanes) - 1;
      std::memset(warps[w].numbers, 0, sizeof warps[w].numbers);
    }
    if (smem) std::memset(smem.get(), 0xFF, config.smem);
  }

  const LaunchConfig& config;
  const std::function<void()>& body;
  const unsigned nthreads;
  const std::uint64_t nblocks;
  std::uint64_t block = 0;  // changed only by NextBlock, while every thread waits
  std::optional<std::barrier<>> sync;
  std::unique_ptr<Warp[]> warps;
  std::unique_ptr<std::byte[]> smem;
  std::barrier<NextBlock> block_end;
  unsigned active;  // workers still in this grid (under the pool's mutex)
};

void NextBlock::operator()() noexcept {
  if (++grid->block < grid->nblocks) grid->reset_block();
}

thread_local Grid* tls_grid = nullptr;
thread_local unsigned tls_thread = 0;    // linear thread index in the block
thread_local unsigned tls_shuffles = 0;  // shuffles this thread made in this block (slot set)

Warp& my_warp() { return tls_grid->warps[tls_thread / 32]; }

class Pool {
 public:
  void run(Grid& grid) {
    std::unique_lock lock(mutex_);
    while (workers_.size() < grid.nthreads) {
      const unsigned index = unsigned(workers_.size());
      workers_.emplace_back([this, index] { work(index); });
      workers_.back().detach();  // parked at exit: the pool lives as long as the process
    }
    grid_ = &grid;
    ++generation_;
    wake_.notify_all();
    done_.wait(lock, [&] { return grid.active == 0; });
    grid_ = nullptr;
  }

 private:
  void work(unsigned index) {
    std::uint64_t seen = 0;
    for (;;) {
      Grid* grid = nullptr;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        grid = grid_;
      }
      if (grid == nullptr || index >= grid->nthreads) continue;
      run_blocks(*grid, index);
      std::lock_guard lock(mutex_);
      if (--grid->active == 0) done_.notify_all();
    }
  }

  static void run_blocks(Grid& grid, unsigned index) {
    const dim3 b = grid.config.block, g = grid.config.grid;
    tls_grid = &grid;
    tls_thread = index;
    threadIdx = uint3{index % b.x, index / b.x % b.y, index / (b.x * b.y)};
    blockDim = b;
    gridDim = g;
    while (grid.block < grid.nblocks) {
      const std::uint64_t k = grid.block;
      blockIdx = uint3{unsigned(k % g.x), unsigned(k / g.x % g.y), unsigned(k / (g.x * g.y))};
      tls_shuffles = 0;
      grid.body();
      my_warp().barrier->arrive_and_drop();
      grid.sync->arrive_and_drop();
      grid.block_end.arrive_and_wait();
    }
    tls_grid = nullptr;
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  std::uint64_t generation_ = 0;
  Grid* grid_ = nullptr;
};

}  // namespace

void run_grid(const LaunchConfig& config, const std::function<void()>& body) {
  // Leaked on purpose: its threads stay parked until the process exits.
  static Pool* const pool = new Pool;
  Grid grid(config, body);
  pool->run(grid);
}

void* dynamic_shared_memory() {
  if (tls_grid == nullptr) fatal("dynamic shared memory used outside a kernel");
  if (!tls_grid->smem)
    fatal("kernel %s uses dynamic shared memory but was launched with 0 bytes",
          tls_grid->config.name);
  return tls_grid->smem.get();
}

void sync_threads() {
  if (tls_grid == nullptr) fatal("__syncthreads outside a kernel");
  tls_grid->sync->arrive_and_wait();
}

int lane_id() { return int(tls_thread % 32); }

void sync_warp(unsigned mask) {
  if (tls_grid == nullptr) fatal("__syncwarp outside a kernel");
  Warp& warp = my_warp();
  if (mask != ~0u && (warp.lanes & ~mask) != 0)
    fatal("kernel %s: __syncwarp(0x%x) over part of a warp is not emulated", tls_grid->config.name,
          mask);
  warp.barrier->arrive_and_wait();
}

std::uint64_t shuffle_bits(unsigned mask, std::uint64_t bits, int src_lane) {
  if (tls_grid == nullptr) fatal("warp shuffle outside a kernel");
  Warp& warp = my_warp();
  const char* name = tls_grid->config.name;
  if (mask != warp.lanes)
    fatal(
        "kernel %s: shuffle mask 0x%08x is not the warp's lanes 0x%08x (partial-warp shuffles are "
        "not emulated; lanes that do not exist are undefined on a GPU)",
        name, mask, warp.lanes);
  const std::uint32_t number = ++tls_shuffles;
  const int lane = lane_id();
  warp.slots[number % 2][lane] = bits;
  warp.numbers[number % 2][lane] = number;
  warp.barrier->arrive_and_wait();  // an exited lane arrives too (it dropped out)
  for (int l = 0; l < 32; ++l)
    if ((mask >> l & 1) && warp.numbers[number % 2][l] != number)
      fatal(
          "kernel %s, thread %u: lane %d is not in shuffle %u of the warp (it has exited or is "
          "at another shuffle): undefined on a GPU",
          name, tls_thread, l, number);
  if (src_lane < 0 || src_lane >= 32 || (mask >> src_lane & 1) == 0)
    fatal("kernel %s, thread %u: shuffle reads lane %d, outside the mask", name, tls_thread,
          src_lane);
  return warp.slots[number % 2][src_lane];
}

}  // namespace strata_emu
