// Attaches NVTX as the profiler of strata's ranges (the step, micro-batches, phases and comm calls:
// profiler_ranges.hpp), so an Nsight Systems timeline of a run names them as --trace does.
#pragma once

namespace strata::cuda {

void attach_nvtx();

}  // namespace strata::cuda
