// The CUDA emulator's block runner: the CUDA threads of a block as fibers on the launching host
// thread (the default), or each on a host thread of its own (STRATA_CUDA_EMU_THREADS=1, and always
// under ThreadSanitizer).
//
// Fibers: a 10-instruction stack switch (not swapcontext, which makes two system calls per switch).
// Each fiber runs until it reaches a barrier, a warp sync or a shuffle, or exits; a barrier opens
// once every live thread of its block (or warp) waits at it. One warp at a time runs, lanes in
// ascending order, until all its lanes wait at the block barrier or have exited; then the next.
// A lane that waits switches straight to the warp's next ready lane (the one the scheduler would
// resume), and the warp's last back to the scheduler, which opens the barriers. A lane that
// returns hands its stack to the next lane when that one has not started yet.
// The schedule is deterministic, so a missing barrier shows the same way every run: a thread
// reading what a later thread or warp writes before the missing barrier reads the 0xFF bytes of
// fresh shared memory or an older tile, and a warp overwriting what a later warp has still to
// read overwrites it first (docs/testing.md: what deleting each of the kernels' barriers did; a
// round robin over all threads caught a subset). Ten times faster than host threads.
//
// Host threads: a pool, grown to the largest block seen and reused by every launch (creating 1024
// threads per block would dominate the run time). For one launch the first nthreads workers run
// the grid's blocks one after another: each runs the kernel body for its threadIdx, leaves the
// block's barriers (an exited CUDA thread no longer holds back __syncthreads), and meets the
// others at the end-of-block barrier. Here a missing __syncthreads is a real data race, which
// ThreadSanitizer reports (`make tsan`).
//
// Either way every block starts with fresh barriers and its dynamic shared memory refilled with
// 0xFF, so a kernel reading shared memory it did not write this block sees NaN.
#include <sys/mman.h>

#include <algorithm>
#include <barrier>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define STRATA_EMU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define STRATA_EMU_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STRATA_EMU_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define STRATA_EMU_TSAN 1
#endif
#endif
#if defined(STRATA_EMU_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif

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
  // The pointers of a warp-collective operation (warp_collective_begin): read only between its
  // two barriers, so one set does.
  const void* published[32] = {};
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
        smem(c.smem > 0 ? static_cast<std::byte*>(::operator new[](c.smem, kSharedAlignment))
                        : nullptr),
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
  // Aligned as a GPU's dynamic shared memory is at least (WMMA wants 32-byte aligned tiles).
  static constexpr std::align_val_t kSharedAlignment{128};
  struct AlignedDelete {
    void operator()(std::byte* p) const { ::operator delete[](p, kSharedAlignment); }
  };
  std::unique_ptr<std::byte[], AlignedDelete> smem;
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

// switch_stack(&from_sp, to_sp): saves the callee-saved registers, the SSE control word and the
// x87 control word on the current stack, stores its pointer in *from_sp, and resumes the stack
// to_sp saved the same way (System V x86-64).
extern "C" void strata_emu_switch_stack(void** from_sp, void* to_sp);
#if defined(__x86_64__)
asm(R"(
  .text
  .p2align 4
  .type strata_emu_switch_stack, @function
strata_emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size strata_emu_switch_stack, .-strata_emu_switch_stack
)");
#else  // elsewhere the threaded mode only (fibers_in_use() is null)
extern "C" void strata_emu_switch_stack(void**, void*) { fatal("fiber mode: x86-64 only"); }
#endif

// AddressSanitizer keeps each host thread's stack bounds and a "fake stack" of returned frames
// (detect_stack_use_after_return): its fiber interface tells it of every switch between the
// scheduler's stack and a fiber's, or it could take a waiting fiber's frames for returned ones.
// Each fiber slot and the scheduler keep their own fake stack across switches (Fiber::fake_stack).
#if defined(STRATA_EMU_ASAN)
inline void asan_start_switch(void** fake, const void* bottom, std::size_t size) {
  __sanitizer_start_switch_fiber(fake, bottom, size);
}
inline void asan_finish_switch(void* fake, const void** bottom, std::size_t* size) {
  __sanitizer_finish_switch_fiber(fake, bottom, size);
}
// A fiber that ends never returns from entry() and yield(): a fake frame of either would stay
// taken, one per thread and block, until its slot's fake stack is full and every fake frame
// allocation scans it (an ASan run of the emulator 5x slower). Neither is instrumented.
#define STRATA_EMU_NO_FAKE_FRAME __attribute__((no_sanitize_address))
#else
inline void asan_start_switch(void**, const void*, std::size_t) {}
inline void asan_finish_switch(void*, const void**, std::size_t*) {}
#define STRATA_EMU_NO_FAKE_FRAME
#endif

// Fiber mode (see the top): the CUDA threads of one block, scheduled on the calling thread.
class Fibers {
 public:
  enum class State { ready, at_block_barrier, at_warp_barrier, done };

  void run(Grid& grid) {
    while (stacks_.size() < grid.nthreads) stacks_.push_back(new_stack());
    fibers_.resize(std::max<std::size_t>(fibers_.size(), grid.nthreads));
    const dim3 b = grid.config.block, g = grid.config.grid;
    tls_grid = &grid;
    blockDim = b;
    gridDim = g;
    grid_ = &grid;
    for (std::uint64_t k = 0; k < grid.nblocks; ++k) {
      blockIdx = uint3{unsigned(k % g.x), unsigned(k / g.x % g.y), unsigned(k / (g.x * g.y))};
      if (k > 0) grid.reset_block();
      run_block(grid);
    }
    tls_grid = nullptr;
  }

  // The running fiber waits (a barrier) or ends. The next ready lane of its warp runs next, the
  // lane the scheduler would resume, switched to directly: one stack switch per wait instead of two
  // through the scheduler (the switches and their mispredicted returns were two fifths of an
  // emulated run). After the warp's last ready lane the scheduler runs and opens the barrier.
  STRATA_EMU_NO_FAKE_FRAME void yield(State state) {
    Fiber& f = fibers_[current_];
    f.state = state;
    f.shuffles = tls_shuffles;
    const unsigned warp_end = std::min(grid_->nthreads, (current_ / 32 + 1) * 32);
    const unsigned next = next_ready(current_ + 1, warp_end);
    if (next < warp_end) {
      enter(next, /*from_scheduler=*/false);
      asan_start_switch(&f.fake_stack, fibers_[next].stack, kStackBytes);
      strata_emu_switch_stack(&f.sp, fibers_[next].sp);
    } else {
      asan_start_switch(&f.fake_stack, scheduler_bottom_, scheduler_size_);
      strata_emu_switch_stack(&f.sp, scheduler_sp_);
    }
    finish_switch_here(f);  // resumed
  }

  // The running lane has returned from the kernel. If the next lane of its warp has not started,
  // that lane takes over this stack and runs here (returns true): one stack and no switch for a
  // warp that never waits, instead of a switch onto a fresh stack per thread. The order is the
  // one yield() would take (the warp's next ready lane). Measured as CPU time, old against new
  // in turn: runner_emu --calibrate (elementwise kernels) 52.3, 45.8 -> 43.0, 39.6 s; a bf16
  // ring-attention run 19.2, 17.9 -> 17.3, 16.0 s, its losses bit for bit the same.
  bool hand_stack_to_next_lane() {
    const unsigned next = current_ + 1;
    if (next >= std::min(grid_->nthreads, (current_ / 32 + 1) * 32)) return false;
    Fiber &f = fibers_[current_], &n = fibers_[next];
    if (n.state != State::ready || n.started) return false;
    f.state = State::done;
    n.stack = f.stack;
    // The fake stack in use stays this stack's; the one saved in the next lane's slot, unused
    // now, goes to this lane's (every fake stack stays in exactly one slot).
    f.fake_stack = n.fake_stack;
    enter(next, /*from_scheduler=*/false);
    return true;
  }

 private:
  static constexpr std::size_t kStackBytes = std::size_t(256) << 10;
  struct Fiber {
    void* sp = nullptr;     // its saved stack pointer (see strata_emu_switch_stack)
    void* stack = nullptr;  // the stack it runs on: its own, or a lane's before it (see above)
    bool started = false;   // entered in this block
    State state = State::done;
    std::uint32_t shuffles = 0;
    uint3 index{};  // its threadIdx (two divisions per switch were a tenth of the scheduler's time)
    // AddressSanitizer's, kept from one block to the next: a body that returned has freed its
    // fake frames, and a fake stack made per fiber start (an mmap) made the ASan tests 2-4x slower.
    void* fake_stack = nullptr;
  };

  // A fresh stack whose first switch "returns" into entry(): the frame strata_emu_switch_stack
  // pops (control words, six registers), entry's address, and a null return address for entry,
  // which never returns. 16-byte aligned as at a function's entry.
  static void* initial_frame(void* stack) {
    auto* top = reinterpret_cast<std::uint64_t*>(static_cast<char*>(stack) + kStackBytes);
    std::uint64_t* sp = top - 9;
    std::uint32_t mxcsr = 0;
    std::uint16_t fcw = 0;
#if defined(__x86_64__)
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fcw));
#endif
    sp[0] = std::uint64_t(mxcsr) | std::uint64_t(fcw) << 32;
    for (int r = 1; r <= 6; ++r) sp[r] = 0;  // r15 r14 r13 r12 rbx rbp
    sp[7] = reinterpret_cast<std::uint64_t>(&Fibers::entry);
    sp[8] = 0;
    return sp;
  }

  static void* new_stack() {  // reserved, not committed: pages come as a fiber touches them
    void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (p == MAP_FAILED) fatal("fiber stack: mmap of %zu bytes failed", kStackBytes);
    return p;
  }

  STRATA_EMU_NO_FAKE_FRAME static void entry();

  // One warp at a time, each until all its live lanes wait at the block barrier or have exited,
  // then the block barrier (see the top).
  void run_block(Grid& grid) {
    const unsigned n = grid.nthreads;
    const dim3 b = grid.config.block;
    for (unsigned i = 0; i < n; ++i) {
      Fiber& f = fibers_[i];
      f.stack = stacks_[i];
      f.sp = initial_frame(f.stack);
      f.started = false;
      f.state = State::ready;
      f.shuffles = 0;
      f.index = uint3{i % b.x, i / b.x % b.y, i / (b.x * b.y)};
    }
    for (;;) {
      for (unsigned w = 0; w * 32 < n; ++w) {
        const unsigned begin = w * 32, end = std::min(n, begin + 32);
        do {
          const unsigned first = next_ready(begin, end);
          if (first < end) resume(first);
        } while (open_warp_barrier(begin, end));
      }
      if (!open_block_barrier(n)) {
        if (std::all_of(fibers_.begin(), fibers_.begin() + n,
                        [](const Fiber& f) { return f.state == State::done; }))
          return;
        fatal(
            "kernel %s: every live thread of block waits, at different barriers (a block "
            "barrier and a warp's): a deadlock on a GPU",
            grid.config.name);
      }
    }
  }

  // The first ready lane of [from, end), or end.
  unsigned next_ready(unsigned from, unsigned end) const {
    while (from < end && fibers_[from].state != State::ready) ++from;
    return from;
  }

  // Opens the barrier of the warp of lanes [begin, end) if every live lane waits at it.
  bool open_warp_barrier(unsigned begin, unsigned end) {
    unsigned live = 0, waiting = 0;
    for (unsigned i = begin; i < end; ++i) {
      live += fibers_[i].state != State::done;
      waiting += fibers_[i].state == State::at_warp_barrier;
    }
    if (live == 0 || waiting != live) return false;
    for (unsigned i = begin; i < end; ++i) fibers_[i].state = State::ready;
    return true;
  }

  // Runs lane i and, through yield, the ready lanes after it in its warp; returns when the last
  // of them waits or exits.
  void resume(unsigned i) {
    enter(i, /*from_scheduler=*/true);
    void* fake_stack = nullptr;
    asan_start_switch(&fake_stack, fibers_[i].stack, kStackBytes);
    strata_emu_switch_stack(&scheduler_sp_, fibers_[i].sp);
    asan_finish_switch(fake_stack, nullptr, nullptr);
  }

  // The thread-local state of lane i, set by whoever switches to it.
  void enter(unsigned i, bool from_scheduler) {
    current_ = i;
    fibers_[i].started = true;
    tls_thread = i;
    tls_shuffles = fibers_[i].shuffles;
    threadIdx = fibers_[i].index;
    entered_from_scheduler_ = from_scheduler;
  }

  // AddressSanitizer's end of a switch onto fiber f's stack; it learns the scheduler's stack
  // (a launching host thread's) when the switch came from there.
  void finish_switch_here(Fiber& f) {
    if (entered_from_scheduler_)
      asan_finish_switch(f.fake_stack, &scheduler_bottom_, &scheduler_size_);
    else
      asan_finish_switch(f.fake_stack, nullptr, nullptr);
  }

  // Opens the block barrier if every live thread waits at it; returns whether it opened.
  bool open_block_barrier(unsigned n) {
    unsigned live = 0, at_block = 0;
    for (unsigned i = 0; i < n; ++i) {
      live += fibers_[i].state != State::done;
      at_block += fibers_[i].state == State::at_block_barrier;
    }
    if (live == 0 || at_block != live) return false;
    for (unsigned i = 0; i < n; ++i)
      if (fibers_[i].state == State::at_block_barrier) fibers_[i].state = State::ready;
    return true;
  }

  std::vector<void*> stacks_;  // kept for later launches (never unmapped: a test fixture)
  std::vector<Fiber> fibers_;
  void* scheduler_sp_ = nullptr;
  const void* scheduler_bottom_ = nullptr;  // the scheduler's stack, for AddressSanitizer
  std::size_t scheduler_size_ = 0;
  Grid* grid_ = nullptr;
  unsigned current_ = 0;
  bool entered_from_scheduler_ = false;  // how the running fiber was entered (for AddressSanitizer)
};

// The mode, chosen once: STRATA_CUDA_EMU_THREADS unset or 0 fibers, 1 host threads. Host threads
// under ThreadSanitizer, which checks threads (fibers would need its fiber interface and would
// hide the races it is run for), and off x86-64 (no stack switch there).
Fibers* fibers_in_use() {  // null in the threaded mode
  static Fibers* const fibers = []() -> Fibers* {
    const char* v = std::getenv("STRATA_CUDA_EMU_THREADS");
    const std::string_view threads = v != nullptr ? v : "0";
    if (threads != "0" && threads != "1")
      fatal(
          "STRATA_CUDA_EMU_THREADS=%s: 0 (fibers, the default) or 1 (a host thread per CUDA "
          "thread)",
          v);
#if defined(__x86_64__) && !defined(STRATA_EMU_TSAN)
    if (threads == "0") return new Fibers;
#endif
    return nullptr;
  }();
  return fibers;
}

void Fibers::entry() {
  Fibers* self = fibers_in_use();
  self->finish_switch_here(self->fibers_[self->current_]);
  do tls_grid->body();
  while (self->hand_stack_to_next_lane());
  self->yield(State::done);  // never resumed
}

// Where a CUDA thread waits at a barrier: its fiber yields, or its host thread blocks.
void wait_at_block_barrier() {
  if (Fibers* f = fibers_in_use())
    f->yield(Fibers::State::at_block_barrier);
  else
    tls_grid->sync->arrive_and_wait();
}
void wait_at_warp_barrier(Warp& warp) {
  if (Fibers* f = fibers_in_use())
    f->yield(Fibers::State::at_warp_barrier);
  else
    warp.barrier->arrive_and_wait();
}

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
        // Decided under the lock: a launch this worker has no thread in can end, and its Grid (on
        // run_grid's stack) go, once the lock is released. Read after it, a stale nthreads sent
        // the worker into a dead launch or a later one (hangs in emu.threaded.blocks, and most
        // likely the SIGFPE of emu.threaded.layers in CI on 2026-12-07).
        if (grid_ != nullptr && index < grid_->nthreads) grid = grid_;
      }
      if (grid == nullptr) continue;
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
  if (Fibers* fibers = fibers_in_use())  // launches run one at a time: one scheduler serves all
    fibers->run(grid);
  else
    pool->run(grid);
}

void* dynamic_shared_memory() {
  if (tls_grid == nullptr) fatal("dynamic shared memory used outside a kernel");
  if (!tls_grid->smem)
    fatal("kernel %s uses dynamic shared memory but was launched with 0 bytes",
          tls_grid->config.name);
  return tls_grid->smem.get();
}

bool in_dynamic_shared_memory(const void* p, std::size_t bytes) {
  if (tls_grid == nullptr || !tls_grid->smem) return false;
  const auto* begin = tls_grid->smem.get();
  const auto* at = static_cast<const std::byte*>(p);
  return at >= begin && at + bytes <= begin + tls_grid->config.smem;
}

void sync_threads() {
  if (tls_grid == nullptr) fatal("__syncthreads outside a kernel");
  wait_at_block_barrier();
}

int lane_id() { return int(tls_thread % 32); }

void sync_warp(unsigned mask) {
  if (tls_grid == nullptr) fatal("__syncwarp outside a kernel");
  Warp& warp = my_warp();
  if (mask != ~0u && (warp.lanes & ~mask) != 0)
    fatal("kernel %s: __syncwarp(0x%x) over part of a warp is not emulated", tls_grid->config.name,
          mask);
  wait_at_warp_barrier(warp);
}

namespace {
// Whether every lane in `mask` is at warp operation `number`. Every lane checks after every
// shuffle and collective: a loop over the lanes with a branch in it took a tenth of an emulated
// tensor-core run; this one is a few vector instructions. The callers find the lane to name only
// when one is not there.
bool all_lanes_at(const std::uint32_t (&numbers)[32], unsigned mask, std::uint32_t number) {
  std::uint32_t differ = 0;
  if (mask == ~0u)
    for (int l = 0; l < 32; ++l) differ |= numbers[l] ^ number;
  else
    for (int l = 0; l < 32; ++l) differ |= (numbers[l] ^ number) * (mask >> l & 1);
  return differ == 0;
}
}  // namespace

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
  wait_at_warp_barrier(warp);  // an exited lane arrives too (it dropped out)
  if (!all_lanes_at(warp.numbers[number % 2], mask, number))
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

// The numbers of warp-collective operations share the shuffles' count (so a lane at a shuffle and
// one at a WMMA call are told apart) with this bit set.
constexpr std::uint32_t kCollectiveBit = 0x80000000u;

const void* const* warp_collective_begin(const char* what, const void* mine) {
  if (tls_grid == nullptr) fatal("%s outside a kernel", what);
  Warp& warp = my_warp();
  const char* name = tls_grid->config.name;
  if (warp.lanes != ~0u)
    fatal("kernel %s: %s in a warp of fewer than 32 threads (0x%08x): undefined on a GPU", name,
          what, warp.lanes);
  const std::uint32_t number = ++tls_shuffles;
  const int lane = lane_id();
  warp.published[lane] = mine;
  warp.numbers[number % 2][lane] = number | kCollectiveBit;
  wait_at_warp_barrier(warp);
  if (!all_lanes_at(warp.numbers[number % 2], ~0u, number | kCollectiveBit))
    for (int l = 0; l < 32; ++l)
      if (warp.numbers[number % 2][l] != (number | kCollectiveBit))
        fatal(
            "kernel %s, thread %u: lane %d is not in %s (warp operation %u): it has exited or "
            "is at another warp operation; undefined on a GPU",
            name, tls_thread, l, what, number);
  return warp.published;
}

void warp_collective_end() { wait_at_warp_barrier(my_warp()); }

void fatal_in_kernel(const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof message, format, args);
  va_end(args);
  if (tls_grid == nullptr) fatal("%s (outside a kernel)", message);
  fatal("kernel %s, thread %u: %s", tls_grid->config.name, tls_thread, message);
}

}  // namespace strata_emu
