#include "run/process_memory.hpp"

#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>

#include "backends/cpu/layers.hpp"

namespace strata {
namespace {

// The largest peak seen before the last restart of the kernel's high-water mark that still
// belongs to the run (see OutsideProcessPeak); 0 right after the baseline.
std::atomic<std::uint64_t> g_carried_peak{0};

// Writing 5 to clear_refs resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0).
bool restart_kernel_peak() {
  const int fd = ::open("/proc/self/clear_refs", O_WRONLY);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "5", 1) == 1;
  ::close(fd);
  return ok;
}

}  // namespace

ProcessMemory read_process_memory() {
  ProcessMemory m;
  std::ifstream f("/proc/self/status");
  auto bytes = [](const std::string& line) {  // "VmRSS:     1234 kB"
    return std::uint64_t(std::strtoull(line.c_str() + line.find(':') + 1, nullptr, 10)) * 1024;
  };
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmRSS:", 0) == 0) m.rss = bytes(line);
    if (line.rfind("VmHWM:", 0) == 0) m.peak_rss = bytes(line);
    if (line.rfind("RssAnon:", 0) == 0) m.rss_anon = bytes(line);
    if (line.rfind("RssFile:", 0) == 0) m.rss_file = bytes(line);
    if (line.rfind("RssShmem:", 0) == 0) m.rss_shmem = bytes(line);
  }
  return m;
}

void configure_allocator() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
}

std::uint64_t mark_runtime_baseline(const MemoryLedger& ledger) {
  cpu::warm_up_gemm();
  ::malloc_trim(0);  // start-up's freed blocks (the SGEMM calibration's matrices) are not runtime
  const std::uint64_t rss = read_process_memory().rss;
  if (restart_kernel_peak()) g_carried_peak = 0;
  return rss > ledger.total() ? rss - ledger.total() : 0;
}

std::uint64_t peak_rss_bytes() {
  std::uint64_t peak = read_process_memory().peak_rss;
  if (peak == 0) {  // no /proc: the lifetime peak
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    peak = std::uint64_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
  }
  return std::max(peak, g_carried_peak.load());
}

OutsideProcessPeak::OutsideProcessPeak() {
  const std::uint64_t peak = read_process_memory().peak_rss;
  std::uint64_t carried = g_carried_peak.load();
  while (peak > carried && !g_carried_peak.compare_exchange_weak(carried, peak)) {
  }
}

OutsideProcessPeak::~OutsideProcessPeak() {
  ::malloc_trim(0);  // the scope's freed blocks (a transport's scratch) do not stay resident
  restart_kernel_peak();
}

}  // namespace strata
