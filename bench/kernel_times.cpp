// Per-kernel GPU time of a whole program, from CUPTI's activity records: what `nsys stats
// --report cuda_gpu_kern_sum` gives, for machines without Nsight Systems (the device tool's have
// Nsight Compute only, which replays every kernel and is too slow for a whole training step).
//
//   CUDA_INJECTION64_PATH=<build>/lib/libstrata_kernel_times.so \
//   STRATA_KERNEL_TIMES=times.txt runner --device cuda ...
//
// The CUDA driver loads the library when the program first initialises CUDA and calls its
// InitializeInjection; at exit it writes one line per kernel name (and per copy/memset kind):
// "total_ns count name", the name demangled and cut before its argument list. One step's kernels
// are the difference of two runs that differ only in --steps (scripts/gpu-check.sh does that):
// a run's kernel sequence is fixed, so nothing has to find where a step begins.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

namespace {

struct Total {
  std::uint64_t ns = 0;
  std::uint64_t count = 0;
};

std::mutex totals_mutex;
std::map<std::string, Total>& totals() {
  static auto* t = new std::map<std::string, Total>;  // outlives other statics: read at exit
  return *t;
}

// "void strata::cuda::(anonymous namespace)::foo<64>(float*, int)" -> "strata::cuda::...::foo<64>"
std::string kernel_name(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  int depth = 0;  // cut at the first '(' outside template brackets
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '<') ++depth;
    if (name[i] == '>') --depth;
    if (name[i] == '(' && depth == 0) return name.substr(0, i);
  }
  return name;
}

const char* copy_kind(std::uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "[memcpy HtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "[memcpy DtoH]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "[memcpy DtoD]";
    default:
      return "[memcpy other]";
  }
}

void add(const std::string& name, std::uint64_t start, std::uint64_t end) {
  Total& t = totals()[name];
  t.ns += end > start ? end - start : 0;
  ++t.count;
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  constexpr std::size_t kBytes = 8 << 20;
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = kBytes;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t,
                               std::size_t valid) {
  CUpti_Activity* record = nullptr;
  const std::lock_guard lock(totals_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      add(kernel_name(k->name), k->start, k->end);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      add(copy_kind(m->copyKind), m->start, m->end);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      add("[memset]", m->start, m->end);
    }
  }
  std::free(buffer);
}

void write_totals() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("STRATA_KERNEL_TIMES");
  std::FILE* out = path ? std::fopen(path, "w") : stderr;
  if (out == nullptr) {
    std::fprintf(stderr, "strata_kernel_times: cannot write %s\n", path);
    return;
  }
  const std::lock_guard lock(totals_mutex);
  for (const auto& [name, t] : totals())
    std::fprintf(out, "%llu %llu %s\n", static_cast<unsigned long long>(t.ns),
                 static_cast<unsigned long long>(t.count), name.c_str());
  if (out != stderr) std::fclose(out);
}

bool check(CUptiResult result, const char* call) {
  if (result == CUPTI_SUCCESS) return true;
  const char* what = nullptr;
  cuptiGetResultString(result, &what);
  std::fprintf(stderr, "strata_kernel_times: %s failed: %s\n", call, what ? what : "?");
  return false;
}

}  // namespace

// Called by the CUDA driver (CUDA_INJECTION64_PATH) when the program initialises CUDA.
extern "C" int InitializeInjection() {
  if (!check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
             "cuptiActivityRegisterCallbacks"))
    return 0;
  for (const CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                        CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET})
    if (!check(cuptiActivityEnable(kind), "cuptiActivityEnable")) return 0;
  std::atexit(write_totals);
  return 1;
}
