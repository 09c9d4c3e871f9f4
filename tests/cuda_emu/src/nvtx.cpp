// The emulator's NVTX ranges (include/nvtx3/nvToolsExt.h).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "nvtx3/nvToolsExt.h"

namespace {

std::atomic<nvtxRangeId_t> g_next_range{1};

// Appends one line to the log, if one is named; a failed write only loses the record.
void log_line(const std::string& line) {
  static const int fd = [] {
    const char* path = std::getenv("STRATA_CUDA_EMU_NVTX_LOG");
    return path && *path ? ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
  }();
  if (fd >= 0 && ::write(fd, line.data(), line.size()) < 0) return;  // the record is lost
}

}  // namespace

nvtxRangeId_t nvtxRangeStartA(const char* message) {
  const nvtxRangeId_t id = g_next_range.fetch_add(1);
  log_line("start " + std::to_string(::getpid()) + ":" + std::to_string(id) + " " + message + "\n");
  return id;
}

void nvtxRangeEnd(nvtxRangeId_t id) {
  log_line("end " + std::to_string(::getpid()) + ":" + std::to_string(id) + "\n");
}
