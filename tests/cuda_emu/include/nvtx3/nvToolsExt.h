// The CUDA emulator's NVTX: the two calls strata makes (cuda/nvtx_ranges.cpp), recorded instead of
// shown on a profiler. With STRATA_CUDA_EMU_NVTX_LOG=FILE each range appends "start ID NAME" and
// "end ID" lines to FILE (one write per line, O_APPEND: several ranks may share the file), so a
// test can check which ranges a run opens and that each one closes (tests/e2e/cuda.cmake).
#pragma once
#include <cstdint>

typedef std::uint64_t nvtxRangeId_t;

nvtxRangeId_t nvtxRangeStartA(const char* message);
void nvtxRangeEnd(nvtxRangeId_t id);
