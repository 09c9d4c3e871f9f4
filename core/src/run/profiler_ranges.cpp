#include "run/profiler_ranges.hpp"

#include <atomic>
#include <string>

namespace strata {
namespace {

// Set at start-up, before the threads that open ranges exist; atomic so that a test may swap
// them while comm workers of an earlier run wind down.
std::atomic<std::uint64_t (*)(const char*)> g_start{nullptr};
std::atomic<void (*)(std::uint64_t)> g_end{nullptr};

}  // namespace

void set_profiler_hooks(const ProfilerHooks& hooks) {
  g_start.store(hooks.start, std::memory_order_release);
  g_end.store(hooks.end, std::memory_order_release);
}

bool profiler_attached() { return g_start.load(std::memory_order_acquire) != nullptr; }

// Range ids are the profiler's, shifted by one so that 0 means "none opened".
std::uint64_t profiler_range_start(const char* name) {
  auto start = g_start.load(std::memory_order_acquire);
  return start ? start(name) + 1 : 0;
}

void profiler_range_end(std::uint64_t range) {
  auto end = g_end.load(std::memory_order_acquire);
  if (range != 0 && end) end(range - 1);
}

ProfilerRange::ProfilerRange(std::string_view kind, std::string_view name) {
  if (!profiler_attached()) return;
  std::string full(kind);
  if (!name.empty()) full.append(" ").append(name);
  range_ = profiler_range_start(full.c_str());
}

}  // namespace strata
