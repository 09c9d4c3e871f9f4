#include "provenance/node_peak.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "backends/backend.hpp"
#include "backends/cpu/gemm_bf16.hpp"
#include "backends/cpu/layers.hpp"
#include "comm/mpi_transport.hpp"
#include "runner/launch.hpp"
#include "runner/run_config.hpp"

namespace strata {

double model_flops_per_rank(double tokens_per_s, double flops_per_token, int ranks) {
  return tokens_per_s * flops_per_token / std::max(1, ranks);
}

double model_flops_utilization(double flops_per_rank, double peak_per_rank) {
  return peak_per_rank > 0 ? flops_per_rank / peak_per_rank
                           : std::numeric_limits<double>::quiet_NaN();
}

double rank_cpu_share(const RankCpus& w) {
  double cpus = double(std::max(1, w.mask_cpus)) / std::max(1, w.ranks_sharing_mask);
  cpus = std::min(cpus, double(std::max(1, w.node_cpus)) / std::max(1, w.node_ranks));
  if (w.cpus_per_task > 0) cpus = std::min(cpus, double(w.cpus_per_task));
  return cpus;
}

double rank_share_of_node_peak(double node_peak, const RankCpus& where) {
  return node_peak * rank_cpu_share(where) / double(std::max(1, where.node_cpus));
}

double node_peak_from_rates(double all_cpus_rate, double one_cpu_rate, int cpus, bool* busy) {
  const double ideal = one_cpu_rate * double(std::max(1, cpus));
  *busy = all_cpus_rate < kMinNodeScaling * ideal;
  return *busy ? ideal : all_cpus_rate;
}

std::string peak_cache_path() {
  if (const char* p = std::getenv("STRATA_PEAK_CACHE"); p && *p)
    return std::string(p) == "off" ? std::string() : std::string(p);
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/strata/peak_flops.tsv";
  if (const char* h = std::getenv("HOME"); h && *h)
    return std::string(h) + "/.cache/strata/peak_flops.tsv";
  return {};
}

std::string peak_cache_key(const std::string& host, const std::string& cpu_model, int cpus,
                           const std::string& precision, const std::string& gemm_library) {
  // Tabs and newlines would break the line format; the key stays readable.
  std::string key = host + "|" + cpu_model + "|" + std::to_string(cpus) + " cpus|" + precision +
                    "|" + gemm_library;
  std::replace_if(
      key.begin(), key.end(), [](char c) { return c == '\t' || c == '\n'; }, ' ');
  return key;
}

namespace {

// The valid "key<TAB>value" lines of the cache file, in order; malformed ones reported.
std::vector<std::pair<std::string, double>> read_cache_lines(const std::string& path,
                                                             std::string* warnings) {
  std::vector<std::pair<std::string, double>> lines;
  // A regular file of at most 1 MiB: STRATA_PEAK_CACHE=/dev/zero or a FIFO must not be read for
  // ever (or written: write_cache_lines would rename a file over the device).
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec)) {
    if (warnings)
      *warnings += "strata: warning: peak cache " + path + " is not a regular file: not used\n";
    return lines;
  }
  constexpr std::size_t kMaxCacheBytes = 1 << 20;
  std::ifstream f(path);
  int number = 0;
  std::size_t bytes = 0;
  for (std::string line; std::getline(f, line);) {
    ++number;
    if ((bytes += line.size() + 1) > kMaxCacheBytes) {
      if (warnings)
        *warnings +=
            "strata: warning: peak cache " + path + " is larger than 1 MiB: the rest ignored\n";
      break;
    }
    const std::size_t tab = line.rfind('\t');
    double value = 0;
    bool ok = tab != std::string::npos && tab > 0;
    if (ok) {
      const std::string text = line.substr(tab + 1);
      char* end = nullptr;
      value = std::strtod(text.c_str(), &end);
      ok = !text.empty() && end && *end == '\0' && value > 0 && value < 1e30;
    }
    if (ok) {
      lines.emplace_back(line.substr(0, tab), value);
    } else if (warnings) {
      *warnings += "strata: warning: peak cache " + path + " line " + std::to_string(number) +
                   " is not 'key<TAB>FLOP/s': ignored\n";
    }
  }
  return lines;
}

bool write_cache_lines(const std::string& path,
                       const std::vector<std::pair<std::string, double>>& lines,
                       std::string* error) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path target(path);
  if (fs::exists(target, ec) && !fs::is_regular_file(target, ec)) {
    if (error) *error = path + " is not a regular file";
    return false;
  }
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    for (const auto& [key, value] : lines) {
      char number[32];
      std::snprintf(number, sizeof number, "%.17g", value);
      out << key << '\t' << number << '\n';
    }
    if (!out.flush()) {
      if (error) *error = "cannot write " + tmp;
      fs::remove(tmp, ec);
      return false;
    }
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    if (error) *error = "cannot rename " + tmp + " to " + path + ": " + ec.message();
    fs::remove(tmp, ec);
    return false;
  }
  return true;
}

}  // namespace

std::optional<double> read_cached_peak(const std::string& path, const std::string& key,
                                       std::string* warnings) {
  if (path.empty()) return std::nullopt;
  for (const auto& [k, v] : read_cache_lines(path, warnings))
    if (k == key) return v;
  return std::nullopt;
}

bool write_cached_peak(const std::string& path, const std::string& key, double flops,
                       std::string* error) {
  auto lines = read_cache_lines(path, nullptr);
  std::erase_if(lines, [&](const auto& l) { return l.first == key; });
  lines.emplace_back(key, flops);
  return write_cache_lines(path, lines, error);
}

bool remove_cached_peak(const std::string& path, const std::string& key) {
  auto lines = read_cache_lines(path, nullptr);
  const std::size_t before = lines.size();
  std::erase_if(lines, [&](const auto& l) { return l.first == key; });
  return lines.size() != before && write_cache_lines(path, lines, nullptr);
}

namespace {

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown cpu";
}

int online_cpus() { return int(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN))); }

// This process allowed on every online CPU (mpirun may have bound it to one); the cgroup's cpuset
// (a Slurm job's share of a node) still narrows it. Returns how many CPUs it may run on then.
int widen_to_usable_cpus() {
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int c = 0; c < online_cpus() && c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
  ::sched_setaffinity(0, sizeof all, &all);
  cpu_set_t now;
  return ::sched_getaffinity(0, sizeof now, &now) == 0 ? std::max(1, CPU_COUNT(&now))
                                                       : online_cpus();
}

// The CPUs a measurement would use, leaving this process's binding as it was.
int usable_cpus() {
  cpu_set_t saved;
  if (::sched_getaffinity(0, sizeof saved, &saved) != 0) return online_cpus();
  const int cpus = widen_to_usable_cpus();
  ::sched_setaffinity(0, sizeof saved, &saved);
  return cpus;
}

const char* gemm_name(bool bf16) { return bf16 ? "bf16 GEMM" : "SGEMM"; }

std::string node_cache_key(const RunConfig& config) {
  const bool bf16 = config.train.precision.mixed();
  return peak_cache_key(mpi::processor_name(), cpu_model_name(), usable_cpus(),
                        bf16 ? "bf16" : "fp32", bf16 ? "oneDNN " + cpu::onednn_version() : "cblas");
}

double best_gemm_rate(bool bf16, int threads, int rounds) {
  cpu::set_blas_threads(threads);
  double best = 0;
  for (int round = 0; round < rounds; ++round)
    best = std::max(best,
                    bf16 ? cpu::calibrate_bf16_gemm_flops(0.25) : cpu::calibrate_sgemm_flops(0.25));
  return best;
}

// The node's GEMM peak: this process widened to every online CPU (mpirun may have bound it to
// one), the GEMM library on as many threads, best of `rounds` ~0.25 s measurements, checked
// against one thread's rate (node_peak_from_rates); the process's binding and thread counts are
// put back afterwards. {flops, cpus, busy}.
std::array<double, 3> measure_node_peak(bool bf16, int rounds) {
  cpu_set_t saved;
  const bool have_mask = ::sched_getaffinity(0, sizeof saved, &saved) == 0;
  const int cpus = widen_to_usable_cpus();
  const int saved_threads = cpu::blas_threads();
  const bool saved_pool = cpu::one_thread_pool();
  cpu::set_one_thread_pool(false);
  const double all_cpus = best_gemm_rate(bf16, cpus, rounds);
  const double one_cpu = cpus > 1 ? best_gemm_rate(bf16, 1, 2) : all_cpus;
  cpu::set_blas_threads(saved_threads);
  cpu::set_one_thread_pool(saved_pool);
  if (have_mask) ::sched_setaffinity(0, sizeof saved, &saved);
  bool busy = false;
  const double flops = node_peak_from_rates(all_cpus, one_cpu, cpus, &busy);
  if (busy)
    std::fprintf(stderr,
                 "strata: warning: %s: %s on %d CPU(s) %.1f GFLOP/s is under %.0f%% of %d x one "
                 "CPU's %.1f GFLOP/s (other work on the node, or GEMM threads confined to fewer "
                 "CPUs); its peak is taken as the latter, %.1f GFLOP/s\n",
                 mpi::processor_name().c_str(), gemm_name(bf16), cpus, all_cpus / 1e9,
                 100 * kMinNodeScaling, cpus, one_cpu / 1e9, flops / 1e9);
  return {flops, double(cpus), busy ? 1.0 : 0.0};
}

// Local rank 0: the node's peak from the cache, or measured (and cached): {flops, from cache,
// cpus, busy}. floor > 0: a peak that proved too low; measured again, twice as long, and never
// below it.
std::array<double, 4> node_peak_on_local_root(const RunConfig& config, double floor) {
  const bool bf16 = config.train.precision.mixed();
  const std::string path = peak_cache_path(), key = node_cache_key(config);
  const char* again = std::getenv("STRATA_PEAK_REMEASURE");
  const bool remeasure = floor > 0 || (again && *again && std::string(again) != "0");
  std::string warnings;
  if (!remeasure)
    if (std::optional<double> cached = read_cached_peak(path, key, &warnings)) {
      std::fputs(warnings.c_str(), stderr);
      return {*cached, 1.0, double(usable_cpus()), 0.0};
    }
  std::fputs(warnings.c_str(), stderr);
  const std::array<double, 3> measured = measure_node_peak(bf16, floor > 0 ? 8 : 4);
  const double flops = std::max(floor, measured[0]);
  std::string error;
  if (!path.empty() && !write_cached_peak(path, key, flops, &error))
    std::fprintf(stderr, "strata: warning: peak cache not written: %s\n", error.c_str());
  return {flops, 0.0, measured[1], measured[2]};
}

PeakFlops cpu_peak(const RunConfig& config, double floor) {
  const mpi::LocalRank local = mpi::local_rank();
  std::array<double, 4> shared{};
  mpi::node_barrier();  // the node's other ranks asleep before rank 0 measures
  if (local.rank == 0) shared = node_peak_on_local_root(config, floor);
  mpi::node_broadcast(shared.data(), int(shared.size()));
  PeakFlops p;
  p.node = shared[0];
  p.node_ranks = local.size;
  RankCpus where;
  where.node_cpus = int(shared[2]), where.node_ranks = local.size;
  where.mask_cpus = affinity_cpus();
  where.ranks_sharing_mask = mpi::node_ranks_with(affinity_fingerprint());  // node-collective
  where.cpus_per_task = slurm_cpus_per_task();
  p.per_rank = rank_share_of_node_peak(p.node, where);
  p.source = shared[1] > 0 ? "cache" : "measured";
  const std::string path = peak_cache_path();
  char line[320];
  std::snprintf(line, sizeof line,
                "node %s %.1f GFLOP/s on %d CPU(s) x this rank's %.3g of them (its mask's %d "
                "CPU(s) / %d rank(s) on it, %d rank(s) on the node)",
                gemm_name(config.train.precision.mixed()), p.node / 1e9, where.node_cpus,
                rank_cpu_share(where), where.mask_cpus, where.ranks_sharing_mask, local.size);
  p.detail = std::string(line) +
             (shared[3] > 0 ? " (poor all-CPU scaling: CPUs x one CPU's rate)" : "") +
             (path.empty() ? ", not cached" : ", cache " + path);
  return p;
}

}  // namespace

PeakFlops resolve_peak_flops(const RunConfig& config) {
  const bool bf16 = config.train.precision.mixed();
  PeakFlops p;
  if (config.peak_tflops > 0) {
    p.per_rank = p.node = config.peak_tflops * 1e12;
    p.source = "option";
    p.detail = "given per rank (--peak-tflops)";
    return p;
  }
  if (const DeviceBackend* gpu = opened_backend(config.device_kind())) {
    p.per_rank = p.node = gpu->peak_flops(bf16);
    p.source = p.per_rank > 0 ? "table" : "none";
    p.detail = p.per_rank > 0 ? std::string("GPU data sheet, ") + (bf16 ? "bf16 dense" : "fp32")
                              : "GPU not in the peak table: no MFU (give --peak-tflops)";
    return p;
  }
  return cpu_peak(config, 0);
}

PeakFlops remeasure_node_peak(const RunConfig& config, const PeakFlops& too_low, double mfu_max) {
  PeakFlops p = cpu_peak(config, too_low.node);
  char note[160];
  std::snprintf(note, sizeof note, "; re-measured after MFU %.1f%% against the %s %.1f GFLOP/s",
                100 * mfu_max, too_low.source.c_str(), too_low.node / 1e9);
  p.detail += note;
  return p;
}

void forget_node_peak(const RunConfig& config) {
  const std::string path = peak_cache_path();
  if (!path.empty()) remove_cached_peak(path, node_cache_key(config));
}

}  // namespace strata
