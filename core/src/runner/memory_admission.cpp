// Memory admission (memory_admission.hpp).
#include "runner/memory_admission.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "util/format.hpp"

namespace strata {
namespace {

// The first line of a small file, or "" when it cannot be read.
std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// A whole number of bytes from a cgroup file; NaN for "max", a value kernels use for "no limit"
// (>= 2^60) or anything unreadable.
double cgroup_bytes(const std::string& path) {
  const std::string text = first_line(path);
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return NAN;
  const double v = std::stod(text);
  return v >= std::ldexp(1.0, 60) ? NAN : v;
}

// The value of `key` in a cgroup's memory.stat ("file 123" lines), 0 when absent.
double stat_bytes(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string k;
  for (double v = 0; in >> k >> v;)
    if (k == key) return v;
  return 0;
}

// The tightest (limit - use) over the cgroup path and its parents, NaN when none is limited. The
// use leaves out the page cache the kernel reclaims before it refuses memory (v2 memory.stat's
// `file`, v1's `total_cache`): after a build, most of a cgroup's use is cache.
// v2: "0::/path" with memory.max and memory.current; v1: "N:...memory...:/path" under memory/.
double cgroup_headroom(const HostMemorySources& s) {
  std::ifstream in(s.self_cgroup);
  double best = NAN;
  for (std::string line; std::getline(in, line);) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
    std::stringstream names(controllers);
    bool v1 = false;
    for (std::string n; std::getline(names, n, ',');) v1 = v1 || n == "memory";
    if (!v1 && !v2) continue;
    const std::string root = s.cgroup_root + (v1 ? "/memory" : "");
    for (std::string dir = line.substr(b + 1);; dir = dir.substr(0, dir.rfind('/'))) {
      const std::string at = root + (dir == "/" ? "" : dir);
      const double limit = cgroup_bytes(at + (v1 ? "/memory.limit_in_bytes" : "/memory.max"));
      const double used = cgroup_bytes(at + (v1 ? "/memory.usage_in_bytes" : "/memory.current"));
      const double cache = stat_bytes(at + "/memory.stat", v1 ? "total_cache" : "file");
      if (!std::isnan(limit))
        best = std::fmin(best, limit - (std::isnan(used) ? 0 : std::max(0.0, used - cache)));
      if (dir.empty() || dir == "/") break;
    }
  }
  return best;
}

// MemAvailable of /proc/meminfo in bytes, NaN when absent.
double mem_available(const std::string& meminfo) {
  std::ifstream in(meminfo);
  for (std::string key; in >> key;) {
    double kib = 0;
    if (key == "MemAvailable:" && in >> kib) return kib * 1024;
    in.ignore(1 << 12, '\n');
  }
  return NAN;
}

// Slurm's memory for this job on this node (MiB in its variables), NaN outside such a job.
double slurm_memory(const HostMemorySources& s) {
  auto number = [&](const char* name) {
    const char* v = s.env(name);
    char* end = nullptr;
    const double x = v && *v ? std::strtod(v, &end) : NAN;
    return end && *end == '\0' && x > 0 ? x : NAN;
  };
  const double per_node = number("SLURM_MEM_PER_NODE");
  if (!std::isnan(per_node)) return per_node * 1024 * 1024;
  return number("SLURM_MEM_PER_CPU") * number("SLURM_CPUS_ON_NODE") * 1024 * 1024;
}

// Bytes a rank's prediction puts in host memory, and on its device (0 on the CPU).
struct RankNeed {
  double host = 0, device = 0;
  std::string largest;  // its largest tags, for the message: "params 1.2 GiB, optimizer ..."
};

RankNeed rank_need(const RunConfig& c, const Strategy& strategy, const TrainSpec& train, int rank) {
  const Prediction p = predict(strategy, PredictInput{c.mesh, c.model, train, rank});
  RankNeed need;
  std::vector<std::pair<double, int>> tags;
  for (int t = 0; t < kNumMemTags; ++t) {
    const bool on_device = c.device_kind() != Device::cpu && !is_host_tag(MemTag(t));
    (on_device ? need.device : need.host) += p.memory_bytes[t];
    if (p.memory_bytes[t] > 0) tags.emplace_back(p.memory_bytes[t], t);
  }
  std::sort(tags.rbegin(), tags.rend());
  for (std::size_t i = 0; i < std::min<std::size_t>(3, tags.size()); ++i)
    need.largest += std::string(i ? ", " : "") + tag_name(MemTag(tags[i].second)) + " " +
                    human_bytes(tags[i].first);
  return need;
}

// What the ranks of this host need: the sum over the world when all of it runs here, else the
// largest rank times the ranks here (which ranks a launcher puts on this host is known only once
// MPI runs). `largest` is the rank needing most, host and device together.
struct HostNeed {
  double host = 0;
  RankNeed largest;
  int largest_rank = 0;
  double largest_host = 0;  // the most host memory one rank needs (its address space)
  int largest_host_rank = 0;
};

HostNeed host_need(const RunConfig& c, const Strategy& strategy, const TrainSpec& train,
                   int ranks_here) {
  const int world = c.mesh.world();
  HostNeed need;
  for (int r = 0; r < world; ++r) {
    const RankNeed n = rank_need(c, strategy, train, r);
    need.host += n.host;
    if (r == 0 || n.host > need.largest_host)
      need.largest_host = n.host, need.largest_host_rank = r;
    if (r == 0 || n.host + n.device > need.largest.host + need.largest.device)
      need.largest = n, need.largest_rank = r;
  }
  if (ranks_here != world) need.host = need.largest_host * ranks_here;
  return need;
}

// "" when `need` fits, else what does not: "the 4 rank(s) of this host need ... more than ...".
std::string shortfall(const RunConfig& c, const HostNeed& need, int ranks_here,
                      const HostMemory& host) {
  const bool cpu = c.device_kind() == Device::cpu;
  const double host_limit = cpu && c.memory_limit > 0 ? c.memory_limit * ranks_here : host.bytes;
  const std::string host_source = cpu && c.memory_limit > 0 ? "--memory-limit" : host.source;
  if (host_limit > 0 && need.host > host_limit)
    return "the " + std::to_string(ranks_here) + " rank(s) of this host need " +
           human_bytes(need.host) + " of host memory, more than the " + human_bytes(host_limit) +
           " they may use (" + host_source + ")";
  const double runtime = host.runtime_address_space;
  if (host.address_space > 0 && need.largest_host + runtime > host.address_space)
    return "rank " + std::to_string(need.largest_host_rank) + " needs about " +
           human_bytes(need.largest_host + runtime) + " of address space (" +
           human_bytes(need.largest_host) + " of memory and about " + human_bytes(runtime) +
           " for the runtime: libraries, MPI, BLAS buffers, thread stacks), more than the " +
           human_bytes(host.address_space) + " each process may map (ulimit -v)";
  if (!cpu && c.memory_limit > 0 && need.largest.device > c.memory_limit)
    return "rank " + std::to_string(need.largest_rank) + " needs " +
           human_bytes(need.largest.device) + " of device memory, more than --memory-limit " +
           human_bytes(c.memory_limit);
  if (!cpu && c.memory_limit == 0 && host.device_free > 0 && need.largest.device > host.device_free)
    return "rank " + std::to_string(need.largest_rank) + " needs " +
           human_bytes(need.largest.device) + " of device memory, more than the " +
           human_bytes(host.device_free) + " free on the GPU with the least (NVML)";
  return "";
}

// The first of a smaller micro-batch (halving) or full recomputation that fits, or advice.
std::string what_fits(const RunConfig& c, const Strategy& strategy, int ranks_here,
                      const HostMemory& host) {
  auto fits = [&](const TrainSpec& train) {
    try {
      return shortfall(c, host_need(c, strategy, train, ranks_here), ranks_here, host).empty();
    } catch (const std::exception&) {
      return false;  // a shape the strategy refuses
    }
  };
  for (int mb = c.train.micro_batch / 2; mb >= 1; mb /= 2) {
    TrainSpec t = c.train;
    t.micro_batch = mb;
    if (c.train.global_batch % mb == 0 && fits(t))
      return "--micro-batch " + std::to_string(mb) + " would fit";
  }
  if (c.train.recompute != Recompute::full) {
    TrainSpec t = c.train;
    t.recompute = Recompute::full;
    if (fits(t)) return "--recompute full would fit";
  }
  return "no smaller micro-batch fits: shard the model state (zero3, fsdp), add ranks or offload "
         "(runner --advise lists what fits)";
}

}  // namespace

double runtime_address_space(int blas_threads) {
  constexpr double MiB = 1024.0 * 1024;
  return 512 * MiB + 136 * MiB * std::max(blas_threads, 2);
}

double current_address_space_limit() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 0;
  return double(limit.rlim_cur);
}

HostMemory host_memory(const HostMemorySources& sources) {
  HostMemory m;
  auto take = [&](double bytes, const std::string& source) {
    if (!std::isnan(bytes) && (m.bytes == 0 || bytes < m.bytes))
      m.bytes = std::max(bytes, 1.0), m.source = source;
  };
  take(mem_available(sources.meminfo), "MemAvailable");
  take(cgroup_headroom(sources), "the cgroup's memory limit less its use");
  take(slurm_memory(sources), "Slurm's memory for the job on this node");
  m.address_space = sources.address_space_limit ? sources.address_space_limit() : 0;
  return m;
}

std::string memory_admission(const RunConfig& c, const Strategy& strategy, int ranks_here,
                             const HostMemory& host) {
  const HostNeed need = host_need(c, strategy, c.train, ranks_here);
  const std::string what = shortfall(c, need, ranks_here, host);
  if (what.empty()) return "";
  return "memory: " + what + "; rank " + std::to_string(need.largest_rank) + " holds " +
         need.largest.largest + "; " + what_fits(c, strategy, ranks_here, host) +
         " (--skip-memory-check runs it anyway)";
}

}  // namespace strata
