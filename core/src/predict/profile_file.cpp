// The profile's HDF5 file (schema strata-profile/1), in the style of the run files: string
// attributes on /, and tables as one 1-D dataset per column (like /calibration), each numeric
// column with a `unit` attribute.
//   /                 attrs schema, source, description, created_utc, host
//   /node_peak_flops  [1] FLOP/s (0: unknown)
//   /compute/...      one row per ComputeEntry (preset, layers, ..., optimizer_s_per_param)
//   /comm_samples/... one row per CommSample (op, ranks, ranks_per_node, bytes, time_s)
//   /comm_fits/...    one row per CommFit (op, ranks, ranks_per_node, alpha_s, beta_bytes_per_s,
//                     points, max_rel_error)
//   /gemm/...         one row per GemmSample (device, precision, threads, ranks_per_node, pass,
//                     m, n, k, time_s); absent in files before the sweep
//   /gemm_roofline/.. one row, a published profile's GemmRoofline (flops_per_s, bytes_per_s,
//                     sms, tile, element_bytes); absent without one
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>

#include "predict/profile.hpp"
#include "results/hdf5_util.hpp"
#include "results/temporary_file.hpp"

namespace strata {
namespace {

using namespace h5;

void attr_string(hid_t obj, const char* name, const std::string& value) {
  Type t = vlen_string_type();
  Space s(check(H5Screate(H5S_SCALAR), "create scalar space"));
  Attribute a(check(H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT),
                    std::string("create attribute ") + name));
  const char* p = value.c_str();
  check(H5Awrite(a, t, &p), std::string("write attribute ") + name);
}

std::string read_attr_string(hid_t obj, const char* name) {
  if (check(H5Aexists(obj, name), std::string("look up attribute ") + name) <= 0)
    throw Error(std::string("attribute '") + name + "' missing");
  Attribute a(check(H5Aopen(obj, name, H5P_DEFAULT), std::string("open attribute ") + name));
  Type t = vlen_string_type();
  char* p = nullptr;
  check(H5Aread(a, t, &p), std::string("read attribute ") + name);
  std::string out = p ? p : "";
  H5free_memory(p);
  return out;
}

void put_doubles(hid_t file, const std::string& path, const std::vector<double>& v,
                 const std::string& unit) {
  const hsize_t n = v.size();
  Space s(check(H5Screate_simple(1, &n, nullptr), "create space of " + path));
  Dataset d(check(
      H5Dcreate2(file, path.c_str(), H5T_IEEE_F64LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
      "create dataset " + path));
  if (n) check(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), path);
  attr_string(d, "unit", unit);
}

void put_strings(hid_t file, const std::string& path, const std::vector<std::string>& v) {
  const hsize_t n = v.size();
  Type t = vlen_string_type();
  Space s(check(H5Screate_simple(1, &n, nullptr), "create space of " + path));
  Dataset d(
      check(H5Dcreate2(file, path.c_str(), t, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path));
  std::vector<const char*> p;
  for (const std::string& x : v) p.push_back(x.c_str());
  if (n) check(H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data()), "write " + path);
}

std::vector<double> get_doubles(hid_t file, const std::string& path) {
  Dataset d(check(H5Dopen2(file, path.c_str(), H5P_DEFAULT), "open dataset " + path));
  Space s(check(H5Dget_space(d), "get space of " + path));
  const hssize_t n = check(H5Sget_simple_extent_npoints(s), "count " + path);
  std::vector<double> v(static_cast<std::size_t>(n));
  if (n) check(H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), path);
  return v;
}

std::vector<std::string> get_strings(hid_t file, const std::string& path) {
  Dataset d(check(H5Dopen2(file, path.c_str(), H5P_DEFAULT), "open dataset " + path));
  Space s(check(H5Dget_space(d), "get space of " + path));
  const hssize_t n = check(H5Sget_simple_extent_npoints(s), "count " + path);
  Type t = vlen_string_type();
  std::vector<char*> p(static_cast<std::size_t>(n), nullptr);
  const herr_t status = n ? H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data()) : 0;
  std::vector<std::string> out;
  for (char* c : p) out.emplace_back(c ? c : ""), H5free_memory(c);
  check(status, "read " + path);
  return out;
}

// A table: named columns of one row type, each a getter and a setter.
template <class Row>
struct Column {
  std::string name, unit;  // unit empty: a string column
  std::function<double(const Row&)> get;
  std::function<void(Row&, double)> set;
  std::function<std::string(const Row&)> get_s;
  std::function<void(Row&, const std::string&)> set_s;
};

#define NUM(T, field, unit)                                                                      \
  Column<T> {                                                                                    \
#field, unit,                                                                                \
        [](const T&                                                                              \
               r) { return double(r.field); },                                                   \
                                            [](T & r,                                            \
                                               double                                            \
                                                   v) { r.field = decltype(r.field)(v); },       \
                                                                                        nullptr, \
                                                                                        nullptr  \
  }
#define STR(T, field)                                                                        \
  Column<T> {                                                                                \
#field, "", nullptr, nullptr,                                                            \
        [](const T& r) { return r.field; }, [](T & r, const std::string& v) { r.field = v; } \
  }

const std::vector<Column<ComputeEntry>>& compute_columns() {
  using E = ComputeEntry;
  static const std::vector<Column<E>> c = {
      STR(E, model.preset),
      NUM(E, model.layers, "layers"),
      NUM(E, model.hidden, "1"),
      NUM(E, model.heads, "heads"),
      NUM(E, model.seq, "tokens"),
      NUM(E, model.vocab, "tokens"),
      Column<E>{"model.arch", "", nullptr, nullptr,
                [](const E& r) { return std::string(arch_name(r.model.arch)); },
                [](E& r, const std::string& v) {
                  if (!parse_arch(v, &r.model.arch))
                    throw Error("model.arch '" + v + "': not gpt2, llama or moe");
                }},
      NUM(E, model.kv_heads, "heads"),
      NUM(E, model.ffn, "1"),
      NUM(E, model.experts, "1"),
      NUM(E, model.top_k, "1"),
      NUM(E, model.shared_experts, "1"),
      NUM(E, model.capacity_factor, "1"),
      NUM(E, micro_batch, "sequences"),
      STR(E, device),
      STR(E, precision),
      NUM(E, threads, "threads"),
      NUM(E, ranks_per_node, "ranks"),
      NUM(E, tp, "ranks"),
      NUM(E, embedding_forward_s, "s"),
      NUM(E, embedding_backward_s, "s"),
      NUM(E, block_forward_s, "s"),
      NUM(E, block_backward_s, "s"),
      NUM(E, head_forward_s, "s"),
      NUM(E, head_backward_s, "s"),
      NUM(E, block_recompute_full_s, "s"),
      NUM(E, block_recompute_selective_s, "s"),
      NUM(E, block_input_backward_s, "s"),
      NUM(E, block_weight_backward_s, "s"),
      NUM(E, optimizer_s_per_param, "s/param"),
      NUM(E, fresh_memory_s_per_byte, "s/byte"),
      NUM(E, copy_s_per_byte, "s/byte"),
      NUM(E, pass_spread, "1")};
  return c;
}
const std::vector<Column<CommSample>>& sample_columns() {
  using S = CommSample;
  static const std::vector<Column<S>> c = {STR(S, op),
                                           NUM(S, ranks, "ranks"),
                                           NUM(S, ranks_per_node, "ranks"),
                                           NUM(S, bytes, "bytes"),
                                           NUM(S, time_s, "s"),
                                           NUM(S, host_ranks, "ranks")};
  return c;
}
const std::vector<Column<CommFit>>& fit_columns() {
  using F = CommFit;
  static const std::vector<Column<F>> c = {STR(F, op),
                                           NUM(F, ranks, "ranks"),
                                           NUM(F, ranks_per_node, "ranks"),
                                           NUM(F, alpha_s, "s"),
                                           NUM(F, beta_bytes_per_s, "bytes/s"),
                                           NUM(F, points, "points"),
                                           NUM(F, max_rel_error, "1"),
                                           NUM(F, host_ranks, "ranks")};
  return c;
}
const std::vector<Column<GemmSample>>& gemm_columns() {
  using G = GemmSample;
  static const std::vector<Column<G>> c = {STR(G, device),
                                           STR(G, precision),
                                           NUM(G, threads, "threads"),
                                           NUM(G, ranks_per_node, "ranks"),
                                           STR(G, pass),
                                           NUM(G, m, "rows"),
                                           NUM(G, n, "columns"),
                                           NUM(G, k, "columns"),
                                           NUM(G, time_s, "s")};
  return c;
}
const std::vector<Column<GemmRoofline>>& roofline_columns() {
  using R = GemmRoofline;
  static const std::vector<Column<R>> c = {
      NUM(R, flops_per_s, "FLOP/s"), NUM(R, bytes_per_s, "bytes/s"), NUM(R, sms, "SMs"),
      NUM(R, tile, "elements"), NUM(R, element_bytes, "bytes")};
  return c;
}
#undef NUM
#undef STR

// "model.preset" is stored as "preset": the table's column names are plain words.
std::string column_path(const std::string& table, const std::string& name) {
  const std::size_t dot = name.find('.');
  return table + "/" + (dot == std::string::npos ? name : name.substr(dot + 1));
}

template <class Row>
void write_table(hid_t file, const std::string& table, const std::vector<Row>& rows,
                 const std::vector<Column<Row>>& columns) {
  Group g(check(H5Gcreate2(file, table.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), table));
  for (const Column<Row>& c : columns) {
    if (c.unit.empty()) {
      std::vector<std::string> v;
      for (const Row& r : rows) v.push_back(c.get_s(r));
      put_strings(file, column_path(table, c.name), v);
    } else {
      std::vector<double> v;
      for (const Row& r : rows) v.push_back(c.get(r));
      put_doubles(file, column_path(table, c.name), v, c.unit);
    }
  }
}

template <class Row>
std::vector<Row> read_table(hid_t file, const std::string& table,
                            const std::vector<Column<Row>>& columns) {
  std::vector<Row> rows;
  bool sized = false;
  for (const Column<Row>& c : columns) {
    const std::string path = column_path(table, c.name);
    // Columns added after the first files (copy_s_per_byte, host_ranks, tp, pass_spread, the
    // model family's and its experts', the split backward's) may be missing: they keep the row's
    // default (0; tp 1; gpt2).
    if (sized &&
        (c.name == "copy_s_per_byte" || c.name == "host_ranks" || c.name == "tp" ||
         c.name == "pass_spread" || c.name.starts_with("model.") ||
         c.name.starts_with("block_input_") || c.name.starts_with("block_weight_")) &&
        H5Lexists(file, path.c_str(), H5P_DEFAULT) <= 0)
      continue;
    std::vector<double> v;
    std::vector<std::string> s;
    std::size_t n = 0;
    if (c.unit.empty())
      s = get_strings(file, path), n = s.size();
    else
      v = get_doubles(file, path), n = v.size();
    if (!sized) rows.resize(n), sized = true;
    if (n != rows.size())
      throw Error(path + " has " + std::to_string(n) + " rows, the table " +
                  std::to_string(rows.size()));
    for (std::size_t i = 0; i < n; ++i)
      c.unit.empty() ? c.set_s(rows[i], s[i]) : c.set(rows[i], v[i]);
  }
  return rows;
}

}  // namespace

void write_profile(const MachineProfile& p, const std::string& path) {
  try {
    TemporaryFile tmp(path);  // HDF5 writes it by name: ours, created exclusively, truncated
    QuietErrors quiet;
    {
      File f(
          check(H5Fcreate(tmp.path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "create"));
      attr_string(f, "schema", kProfileSchema);
      attr_string(f, "source", p.source);
      attr_string(f, "description", p.description);
      attr_string(f, "created_utc", p.created_utc);
      attr_string(f, "host", p.host);
      put_doubles(f, "/node_peak_flops", {p.node_peak_flops}, "FLOP/s");
      write_table(f, "/compute", p.compute, compute_columns());
      write_table(f, "/comm_samples", p.samples, sample_columns());
      write_table(f, "/comm_fits", p.comm, fit_columns());
      write_table(f, "/gemm", p.gemms, gemm_columns());
      if (p.roofline.flops_per_s > 0)
        write_table(f, "/gemm_roofline", std::vector{p.roofline}, roofline_columns());
      check(f.close(), "close");
    }
    tmp.commit(true);
  } catch (const Error& e) {
    throw Error("cannot write profile '" + path + "': " + e.what(), "check the directory");
  }
}

MachineProfile read_profile(const std::string& path) {
  try {
    QuietErrors quiet;
    File f(check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "open"));
    const std::string schema = read_attr_string(f, "schema");
    if (schema != kProfileSchema)
      throw Error("schema is '" + schema + "', expected " + kProfileSchema);
    MachineProfile p;
    p.source = read_attr_string(f, "source");
    p.description = read_attr_string(f, "description");
    p.created_utc = read_attr_string(f, "created_utc");
    p.host = read_attr_string(f, "host");
    const std::vector<double> peak = get_doubles(f, "/node_peak_flops");
    p.node_peak_flops = peak.empty() ? 0 : peak[0];
    p.compute = read_table(f, "/compute", compute_columns());
    p.samples = read_table(f, "/comm_samples", sample_columns());
    p.comm = read_table(f, "/comm_fits", fit_columns());
    if (H5Lexists(f, "/gemm", H5P_DEFAULT) > 0) p.gemms = read_table(f, "/gemm", gemm_columns());
    if (H5Lexists(f, "/gemm_roofline", H5P_DEFAULT) > 0) {
      const auto rows = read_table(f, "/gemm_roofline", roofline_columns());
      if (rows.size() != 1)
        throw Error("/gemm_roofline has " + std::to_string(rows.size()) + " rows, not 1");
      p.roofline = rows.front();
    }
    return p;
  } catch (const Error& e) {
    throw Error("--profile " + path + ": not a readable " + kProfileSchema + " file: " + e.what(),
                "make one with runner --calibrate --profile FILE");
  }
}

}  // namespace strata
