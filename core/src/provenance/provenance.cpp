#include "provenance/provenance.hpp"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <fstream>

#include "backends/backend.hpp"
#include "backends/cpu/gemm_bf16.hpp"
#include "backends/cpu/layers.hpp"
#include "comm/mpi_transport.hpp"
#include "comm/transport.hpp"

extern char** environ;

namespace strata {

std::string utc_timestamp(bool compact) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, compact ? "%Y%m%dT%H%M%SZ" : "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

static std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// Each provider's entries replace the core's of the same key, or are added after them.
static void add_registered(Provenance& p) {
  for (ProvenanceProvider provider : provenance_providers())
    for (auto& entry : provider()) {  // not a structured binding: clang 14 cannot capture one
      auto same =
          std::find_if(p.begin(), p.end(), [&](const auto& e) { return e.first == entry.first; });
      if (same != p.end())
        same->second = entry.second;
      else
        p.push_back(entry);
    }
}

std::string version_line() {
  return std::string("strata ") + STRATA_VERSION + " (git " + STRATA_GIT_DESCRIBE + ")";
}

Provenance collect_provenance() {
  Provenance p;
  auto env = [](const char* k) {
    const char* v = std::getenv(k);
    return std::string(v ? v : "");
  };
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  p.emplace_back("strata_version", STRATA_VERSION);
  p.emplace_back("git_describe", STRATA_GIT_DESCRIBE);
  p.emplace_back("compiler", std::string("g++ ") + __VERSION__);
  p.emplace_back("build_type", STRATA_BUILD_TYPE);
  p.emplace_back("mpi_version", mpi::library_version());
  p.emplace_back("hdf5_version",
                 std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel));
  p.emplace_back("ucx_version", transport_version("ucx"));
  p.emplace_back("gloo_version", transport_version("gloo"));
  // A backend library a run did not use is not loaded (backend.hpp); a loaded one's provider
  // (add_registered) replaces these with its versions.
  const char* unused = "not loaded (not used by this run)";
  p.emplace_back("nccl_version", transport_built("nccl") ? unused : "not built");
  p.emplace_back("cuda_version", backend_built(Device::cuda) ? unused : "not built");
  p.emplace_back("onednn_version", cpu::onednn_version());
  p.emplace_back("onednn_bf16_gemm_impl", cpu::bf16_gemm_impl());
  p.emplace_back("blas_threads", std::to_string(cpu::blas_threads()));
  p.emplace_back("cpu_model", cpu_model());
  p.emplace_back("cores_online", std::to_string(sysconf(_SC_NPROCESSORS_ONLN)));
  p.emplace_back("slurm_job_id", env("SLURM_JOB_ID"));
  p.emplace_back("slurm_nodelist", env("SLURM_JOB_NODELIST"));
  add_registered(p);
  // Selected environment: what changes how the transports and BLAS behave.
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    for (const char* prefix : {"OMPI_", "UCX_", "NCCL_", "GLOO_", "STRATA_GLOO_", "OPENBLAS_",
                               "OMP_NUM_THREADS", "SLURM_"})
      if (kv.rfind(prefix, 0) == 0) {
        auto eq = kv.find('=');
        p.emplace_back("env." + kv.substr(0, eq), kv.substr(eq + 1));
      }
  }
  return p;
}

}  // namespace strata
