// profile_from_table (published_profile.hpp).
#include "predict/published_profile.hpp"

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "run/calibrate.hpp"
#include "strata/comm.hpp"
#include "strata/types.hpp"

namespace strata {
namespace {

const std::set<std::string> kNumbers = {"gpus_per_node",
                                        "peak_flops_per_gpu",
                                        "gemm_efficiency",
                                        "hbm_bytes_per_s",
                                        "memory_efficiency",
                                        "nvlink_bytes_per_s",
                                        "nvlink_efficiency",
                                        "nvlink_latency_s",
                                        "network_bytes_per_s",
                                        "network_efficiency",
                                        "network_latency_s",
                                        "micro_batch",
                                        "optimizer_bytes_per_param",
                                        "host_link_bytes_per_s",
                                        "host_link_efficiency"};
// Optional: with it, GEMMs are timed by shape (GemmRoofline); without, other model shapes scale
// FLOP-proportionally from the reference entry.
const std::set<std::string> kOptionalNumbers = {"sm_count"};
const std::set<std::string> kTexts = {"source", "description", "device", "precision",
                                      "reference_model"};

std::map<std::string, std::string> read_table(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("--calibrate-from " + path + ": cannot read the table");
  std::map<std::string, std::string> table;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string key, value;
    if (!(words >> key)) continue;
    std::getline(words >> std::ws, value);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.pop_back();
    const std::string where = "--calibrate-from " + path + " line " + std::to_string(n) + ": ";
    const bool number = kNumbers.count(key) || kOptionalNumbers.count(key);
    if (!number && !kTexts.count(key)) throw ConfigError(where + "unknown key '" + key + "'");
    char* end = nullptr;
    if (number && (value.empty() || (std::strtod(value.c_str(), &end), *end) ||
                   !(std::strtod(value.c_str(), nullptr) > 0)))
      throw ConfigError(where + key + " must be a positive number, not '" + value + "'");
    if (value.empty()) throw ConfigError(where + key + " has no value");
    table[key] = value;
  }
  for (const auto& keys : {kNumbers, kTexts})
    for (const std::string& k : keys)
      if (!table.count(k)) throw ConfigError("--calibrate-from " + path + ": no '" + k + "' line");
  return table;
}

// Alpha-beta fits of the measured ops (kCalibratedCommOps) on a group of `ranks` (`per_node` per
// node) whose links carry `busbw` (nccl-tests bus bandwidth, bytes/s) after `alpha` seconds.
void add_fits(MachineProfile& p, int ranks, int per_node, double busbw, double alpha) {
  for (CommOp op : kCalibratedCommOps)
    p.comm.push_back(
        CommFit{op_name(op), ranks, per_node, alpha, busbw / bus_factor(op, ranks), 0, 0});
}

}  // namespace

MachineProfile profile_from_table(const std::string& path) {
  const auto t = read_table(path);
  auto num = [&](const std::string& k) { return std::strtod(t.at(k).c_str(), nullptr); };
  MachineProfile p;
  p.source = "published";
  p.description = t.at("description") + "; source = published figures: " + t.at("source");
  p.host = "none (published figures, " + path + ")";
  const int per_node = int(num("gpus_per_node"));
  p.node_peak_flops = per_node * num("peak_flops_per_gpu");

  // One reference entry: GEMM-bound passes at the achieved rate (FLOPs as flops_per_token counts
  // them), the embedding's lookup and AdamW at the achieved memory bandwidth.
  ComputeEntry e;
  e.model = model_preset(t.at("reference_model"));
  e.micro_batch = int(num("micro_batch"));
  e.device = t.at("device"), e.precision = t.at("precision");
  e.threads = 1, e.ranks_per_node = per_node;
  const double rate = num("peak_flops_per_gpu") * num("gemm_efficiency");
  const double bandwidth = num("hbm_bytes_per_s") * num("memory_efficiency");
  const double tokens = double(e.micro_batch) * e.model.seq, h = e.model.hidden;
  e.block_forward_s = tokens * (24 * h * h + 4 * h * e.model.seq) / rate;
  e.block_backward_s = 2 * e.block_forward_s;
  e.block_recompute_full_s = e.block_forward_s;
  e.block_recompute_selective_s = tokens * 4 * h * e.model.seq / rate;
  e.head_forward_s = tokens * 2 * h * e.model.vocab / rate;
  e.head_backward_s = 2 * e.head_forward_s;
  e.embedding_forward_s = tokens * h * 8 / bandwidth;  // read a row, write the fp32 stream
  e.embedding_backward_s = 2 * e.embedding_forward_s;
  e.optimizer_s_per_param = num("optimizer_bytes_per_param") / bandwidth;
  e.fresh_memory_s_per_byte = 1 / bandwidth;  // a caching allocator: the buffer's write only
  e.copy_s_per_byte = 1 / (num("host_link_bytes_per_s") * num("host_link_efficiency"));
  p.compute.push_back(e);
  if (t.count("sm_count")) p.roofline = GemmRoofline{rate, bandwidth, int(num("sm_count")), 128, 2};

  const double intra = num("nvlink_bytes_per_s") * num("nvlink_efficiency");
  const double inter = num("network_bytes_per_s") * num("network_efficiency");
  add_fits(p, per_node, per_node, intra, num("nvlink_latency_s"));
  add_fits(p, 2, 1, inter, num("network_latency_s"));  // one rank per node (a NIC each)
  add_fits(p, 2 * per_node, per_node, inter, num("network_latency_s"));  // whole nodes
  return p;
}

}  // namespace strata
