// NVTX behind strata's profiler ranges (profiler_ranges.hpp): start/end ranges, not push/pop,
// since a comm call's range may open on one thread and the next micro-batch close another's. The
// NVTX v3 headers are header-only: without Nsight Systems (or another NVTX tool) attached, each
// call returns after one check.
#include "backends/cuda/nvtx_ranges.hpp"

#include <nvtx3/nvToolsExt.h>

#include "run/profiler_ranges.hpp"

namespace strata::cuda {
namespace {

std::uint64_t nvtx_start(const char* name) { return nvtxRangeStartA(name); }
void nvtx_end(std::uint64_t range) { nvtxRangeEnd(nvtxRangeId_t(range)); }

}  // namespace

void attach_nvtx() { set_profiler_hooks(ProfilerHooks{nvtx_start, nvtx_end}); }

}  // namespace strata::cuda
