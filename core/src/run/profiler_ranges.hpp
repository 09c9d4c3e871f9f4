// The profiler behind strata::profiler_range_start / profiler_range_end (strata/context.hpp): none
// by default; a CUDA build's runner attaches NVTX (cuda/nvtx_ranges.cpp) at start-up, so Nsight
// Systems shows the step, its micro-batches, phases and comm calls as the --trace timeline names
// them. Ranges are start/end pairs, not a per-thread stack: a comm stream's worker thread, or the
// next micro-batch, may close what another place opened.
#pragma once
#include <cstdint>
#include <string_view>

#include "strata/context.hpp"  // profiler_range_start, profiler_range_end
#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

struct ProfilerHooks {
  std::uint64_t (*start)(const char* name) = nullptr;  // opens a range, returns its id
  void (*end)(std::uint64_t range) = nullptr;
};
// Before any range is opened (start-up, or a test); ProfilerHooks{} detaches.
void set_profiler_hooks(const ProfilerHooks& hooks);
bool profiler_attached();

// A range named `kind` or "kind name" (an op and its group: "all_reduce tp"), open for the
// object's lifetime. The name is built only when a profiler is attached.
class ProfilerRange {
 public:
  explicit ProfilerRange(std::string_view kind, std::string_view name = {});
  ~ProfilerRange() { profiler_range_end(range_); }
  ProfilerRange(const ProfilerRange&) = delete;
  ProfilerRange& operator=(const ProfilerRange&) = delete;

 private:
  std::uint64_t range_ = 0;  // 0: none opened
};

}  // namespace strata
STRATA_EXPORT_END
