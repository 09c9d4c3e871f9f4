// Reads a run file (schema strata-run/1 or 1.1, docs/architecture.md "Run file") back into a
// RunRecord. Strings may be variable-length or fixed-length; attribute order is creation order when
// the file tracks it (files written by strata do), else name order.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <vector>

#include "results/hdf5_util.hpp"
#include "results/run_record.hpp"

namespace strata {
namespace {

using namespace h5;
namespace fs = std::filesystem;

const char* const kDamagedHint = "the file is damaged or was not written by strata";

// An attribute or a dataset to read from, with its name for messages.
struct Source {
  hid_t id;
  bool is_attr;
  std::string what;  // e.g. "attribute 'unit' of '/steps/loss'"

  hid_t type() const { return is_attr ? H5Aget_type(id) : H5Dget_type(id); }
  hid_t space() const { return is_attr ? H5Aget_space(id) : H5Dget_space(id); }
  herr_t read(hid_t mem_type, void* buf) const {
    return is_attr ? H5Aread(id, mem_type, buf)
                   : H5Dread(id, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
  }
};

// The dimensions of `src` (empty for a scalar) and its element count.
std::vector<hsize_t> dims_of(const Source& src, hsize_t* count) {
  Space space(check(src.space(), "get dataspace of " + src.what));
  const H5S_class_t cls = H5Sget_simple_extent_type(space);
  check(static_cast<int>(cls), "get dataspace class of " + src.what);
  std::vector<hsize_t> dims;
  if (cls == H5S_SIMPLE) {
    dims.resize(check(H5Sget_simple_extent_ndims(space), "get rank of " + src.what));
    check(H5Sget_simple_extent_dims(space, dims.data(), nullptr), "get dims of " + src.what);
  }
  *count = check(H5Sget_simple_extent_npoints(space), "count elements of " + src.what);
  return dims;
}

// A dataset whose storage is not (fully) allocated reads back as fill values, whatever its dims:
// a few bytes of file could make us allocate terabytes. strata writes every value of every dataset,
// so such a dataset is damage, refused before anything is allocated for it.
void expect_stored(const Source& src, hsize_t count) {
  if (src.is_attr || count == 0) return;
  H5D_space_status_t status{};
  check(H5Dget_space_status(src.id, &status), "get storage status of " + src.what);
  if (status != H5D_SPACE_STATUS_ALLOCATED)
    throw Error(src.what + " has " + std::to_string(count) + " elements but " +
                    (status == H5D_SPACE_STATUS_NOT_ALLOCATED ? "none" : "not all") +
                    " of them are stored",
                kDamagedHint);
}

std::vector<std::string> read_strings(const Source& src) {
  Type file_type(check(src.type(), "get type of " + src.what));
  if (H5Tget_class(file_type) != H5T_STRING)
    throw Error(src.what + " is not a string", kDamagedHint);
  hsize_t n = 0;
  dims_of(src, &n);
  expect_stored(src, n);
  std::vector<std::string> out;
  if (n == 0) return out;
  if (check(H5Tis_variable_str(file_type), "inspect type of " + src.what) > 0) {
    Type mem = vlen_string_type();
    const H5T_cset_t cset = H5Tget_cset(file_type);
    check(static_cast<int>(cset), "get charset of " + src.what);
    check(H5Tset_cset(mem, cset), "set string type charset");
    std::vector<char*> p(n, nullptr);
    const herr_t status = src.read(mem, p.data());
    for (char* s : p) {
      out.emplace_back(s ? s : "");
      H5free_memory(s);
    }
    check(status, "read " + src.what);
    return out;
  }
  const std::size_t size = H5Tget_size(file_type);
  if (size == 0) throw Error("cannot get the string size of " + src.what, kDamagedHint);
  const bool space_pad = H5Tget_strpad(file_type) == H5T_STR_SPACEPAD;
  Type mem(check(H5Tcopy(file_type), "copy type of " + src.what));
  std::string buf(n * size, '\0');
  check(src.read(mem, buf.data()), "read " + src.what);
  for (hsize_t i = 0; i < n; ++i) {
    std::string s = buf.substr(i * size, size);
    const std::size_t end = space_pad ? s.find_last_not_of(' ') + 1 : s.find('\0');
    if (end != std::string::npos) s.resize(end);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<double> read_doubles(const Source& src, std::vector<hsize_t>* dims) {
  Type file_type(check(src.type(), "get type of " + src.what));
  const H5T_class_t cls = H5Tget_class(file_type);
  if (cls != H5T_FLOAT && cls != H5T_INTEGER)
    throw Error(src.what + " is not numeric", kDamagedHint);
  hsize_t n = 0;
  *dims = dims_of(src, &n);
  expect_stored(src, n);
  std::vector<double> out(n);
  if (n > 0) check(src.read(H5T_NATIVE_DOUBLE, out.data()), "read " + src.what);
  return out;
}

bool has_attr(hid_t obj, const std::string& obj_path, const std::string& name) {
  return check(H5Aexists(obj, name.c_str()),
               "look up attribute '" + name + "' of '" + obj_path + "'") > 0;
}

Attribute open_attr(hid_t obj, const std::string& obj_path, const std::string& name) {
  const std::string what = "attribute '" + name + "' of '" + obj_path + "'";
  if (!has_attr(obj, obj_path, name)) throw Error("missing " + what, kDamagedHint);
  return Attribute(check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), "open " + what));
}

std::vector<std::string> attr_strings(hid_t obj, const std::string& obj_path,
                                      const std::string& name) {
  Attribute a = open_attr(obj, obj_path, name);
  return read_strings({a, true, "attribute '" + name + "' of '" + obj_path + "'"});
}

std::string attr_string(hid_t obj, const std::string& obj_path, const std::string& name) {
  auto v = attr_strings(obj, obj_path, name);
  if (v.size() != 1)
    throw Error("attribute '" + name + "' of '" + obj_path + "' is not a single string",
                kDamagedHint);
  return v[0];
}

double attr_double(hid_t obj, const std::string& obj_path, const std::string& name) {
  Attribute a = open_attr(obj, obj_path, name);
  std::vector<hsize_t> dims;
  auto v = read_doubles({a, true, "attribute '" + name + "' of '" + obj_path + "'"}, &dims);
  if (v.size() != 1)
    throw Error("attribute '" + name + "' of '" + obj_path + "' is not a single number",
                kDamagedHint);
  return v[0];
}

// A count or a rank stored as a number: a whole number in [0, INT_MAX] (converting anything else to
// int would be undefined).
int whole_number(double value, const char* what) {
  if (!(value >= 0 && value <= INT_MAX && value == std::floor(value))) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", value);
    throw Error(std::string(what) + " is " + text + ", not a whole number >= 0", kDamagedHint);
  }
  return static_cast<int>(value);
}

bool has_link(hid_t file, const std::string& path) {
  return check(H5Lexists(file, path.c_str(), H5P_DEFAULT), "look up '" + path + "'") > 0;
}

Dataset open_dataset(hid_t file, const std::string& path) {
  if (!has_link(file, path)) throw Error("missing dataset '" + path + "'", kDamagedHint);
  return Dataset(check(H5Dopen2(file, path.c_str(), H5P_DEFAULT), "open dataset '" + path + "'"));
}

// A dataset's values and dims; `unit` (when given) receives its "unit" attribute.
std::vector<double> dataset_doubles(hid_t file, const std::string& path, std::vector<hsize_t>* dims,
                                    std::string* unit = nullptr) {
  Dataset d = open_dataset(file, path);
  if (unit) *unit = attr_string(d, path, "unit");
  return read_doubles({d, false, "dataset '" + path + "'"}, dims);
}

std::vector<std::string> dataset_strings(hid_t file, const std::string& path) {
  Dataset d = open_dataset(file, path);
  return read_strings({d, false, "dataset '" + path + "'"});
}

// The row count of a table (/trace, /calibration) whose columns have these lengths.
std::size_t table_rows(const std::string& table, std::initializer_list<std::size_t> lengths) {
  const std::size_t n = *lengths.begin();
  for (std::size_t length : lengths)
    if (length != n) throw Error(table + ": datasets of different lengths", kDamagedHint);
  return n;
}

Group open_group(hid_t file, const std::string& path) {
  if (!has_link(file, path)) throw Error("missing group '" + path + "'", kDamagedHint);
  return Group(check(H5Gopen2(file, path.c_str(), H5P_DEFAULT), "open group '" + path + "'"));
}

// Creation order when the group tracks it (links or attributes), else name order.
H5_index_t order_of(hid_t group, const std::string& path, bool links) {
  PropList gcpl(check(H5Gget_create_plist(group), "get creation properties of '" + path + "'"));
  unsigned flags = 0;
  check(links ? H5Pget_link_creation_order(gcpl, &flags) : H5Pget_attr_creation_order(gcpl, &flags),
        "get creation order of '" + path + "'");
  return (flags & H5P_CRT_ORDER_TRACKED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
}

std::vector<std::string> attr_names(hid_t group, const std::string& path) {
  std::vector<std::string> names;
  auto cb = [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->emplace_back(name);
    return 0;
  };
  check(H5Aiterate2(group, order_of(group, path, false), H5_ITER_INC, nullptr, cb, &names),
        "list attributes of '" + path + "'");
  return names;
}

std::vector<std::string> link_names(hid_t group, const std::string& path) {
  H5G_info_t info;
  check(H5Gget_info(group, &info), "get info of group '" + path + "'");
  const H5_index_t order = order_of(group, path, true);
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const std::string what = "get name of link " + std::to_string(i) + " of '" + path + "'";
    const ssize_t len =
        check(H5Lget_name_by_idx(group, ".", order, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT), what);
    std::string name(static_cast<std::size_t>(len) + 1, '\0');
    check(H5Lget_name_by_idx(group, ".", order, H5_ITER_INC, i, name.data(), name.size(),
                             H5P_DEFAULT),
          what);
    name.resize(static_cast<std::size_t>(len));
    names.push_back(std::move(name));
  }
  return names;
}

std::vector<std::pair<std::string, std::string>> string_attrs(hid_t file, const std::string& path) {
  Group g = open_group(file, path);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& name : attr_names(g, path)) out.emplace_back(name, attr_string(g, path, name));
  return out;
}

// One /config attribute as text and its type: a string (every value of a strata-run/1 file), an
// integer, a float or a boolean (strata-run/1.1, run_record.hpp ConfigType).
std::string config_value(hid_t config, const std::string& key, ConfigType* type) {
  const std::string what = "attribute '" + key + "' of '/config'";
  Attribute a = open_attr(config, "/config", key);
  Type t(check(H5Aget_type(a), "get type of " + what));
  const H5T_class_t cls = H5Tget_class(t);
  if (cls == H5T_STRING) {
    *type = ConfigType::text;
    return attr_string(config, "/config", key);
  }
  hsize_t n = 0;
  dims_of({a, true, what}, &n);
  if (n != 1) throw Error(what + " is not a single value", kDamagedHint);
  if (cls == H5T_INTEGER) {
    long long v = 0;
    check(H5Aread(a, H5T_NATIVE_LLONG, &v), "read " + what);
    *type = ConfigType::integer;
    return std::to_string(v);
  }
  if (cls == H5T_FLOAT) {
    double v = 0;
    check(H5Aread(a, H5T_NATIVE_DOUBLE, &v), "read " + what);
    *type = ConfigType::real;
    return real_text(v);
  }
  if (cls == H5T_ENUM) {
    signed char v = 0;
    Type mem = bool_type();  // converts by member name: FALSE and TRUE only
    check(H5Aread(a, mem, &v), "read " + what, "a boolean is an enum of FALSE = 0 and TRUE = 1");
    *type = ConfigType::boolean;
    return v ? "true" : "false";
  }
  throw Error(what + " is not a string, a number or a boolean", kDamagedHint);
}

void read_config(hid_t file, RunRecord& r) {
  Group g = open_group(file, "/config");
  for (const auto& key : attr_names(g, "/config")) {
    ConfigType type = ConfigType::text;
    r.config.emplace_back(key, config_value(g, key, &type));
    if (type != ConfigType::text) r.config_types[key] = type;
  }
}

// Every step and comm matrix is [ranks x steps]. The shape comes from the "/steps" attributes
// "ranks" and "steps" when present, else from the first matrix (`known` tells which).
void expect_shape(const std::vector<hsize_t>& dims, RunRecord& r, bool& known,
                  const std::string& path) {
  if (!known && dims.size() == 2) {
    r.ranks = static_cast<int>(dims[0]);
    r.steps = static_cast<int>(dims[1]);
    known = true;
  }
  if (dims.size() != 2 || dims[0] != hsize_t(r.ranks) || dims[1] != hsize_t(r.steps))
    throw Error("dataset '" + path + "' is not [ranks x steps] = [" + std::to_string(r.ranks) +
                    " x " + std::to_string(r.steps) + "]",
                kDamagedHint);
}

// What was not measured is written with no rows, so a per-rank matrix is `want` ([ranks] or
// [ranks x tags]) or `want` with 0 rows; `shape` names `want` for the message.
void expect_rows(const std::vector<hsize_t>& dims, std::vector<hsize_t> want,
                 const std::string& path, const std::string& shape) {
  if (dims == want) return;
  std::string text;
  for (hsize_t d : want) text += (text.empty() ? "" : " x ") + std::to_string(d);
  want[0] = 0;
  if (dims != want)
    throw Error("dataset '" + path + "' is not [" + shape + "] = [" + text + "] or empty",
                kDamagedHint);
}

void read_steps_and_comm(hid_t file, RunRecord& r) {
  Group steps = open_group(file, "/steps");
  bool known = has_attr(steps, "/steps", "ranks") && has_attr(steps, "/steps", "steps");
  if (known) {
    r.ranks = whole_number(attr_double(steps, "/steps", "ranks"), "attribute 'ranks' of '/steps'");
    r.steps = whole_number(attr_double(steps, "/steps", "steps"), "attribute 'steps' of '/steps'");
  }
  std::vector<hsize_t> dims;
  for (const auto& m : link_names(steps, "/steps")) {
    const std::string path = "/steps/" + m;
    r.step_values[m] = dataset_doubles(file, path, &dims, &r.step_units[m]);
    expect_shape(dims, r, known, path);
    r.step_metrics.push_back(m);
  }
  Group comm = open_group(file, "/comm");
  for (const auto& op : link_names(comm, "/comm")) {
    const std::string path = "/comm/" + op;
    Group g = open_group(file, path);
    CommSeries& c = r.comm[op];
    c.calls = dataset_doubles(file, path + "/calls", &dims);
    expect_shape(dims, r, known, path + "/calls");
    c.bytes = dataset_doubles(file, path + "/bytes", &dims);
    expect_shape(dims, r, known, path + "/bytes");
    c.time_s = dataset_doubles(file, path + "/time_s", &dims);
    expect_shape(dims, r, known, path + "/time_s");
    c.algbw = dataset_doubles(file, path + "/algbw", &dims);
    expect_shape(dims, r, known, path + "/algbw");
    c.busbw = dataset_doubles(file, path + "/busbw", &dims);
    expect_shape(dims, r, known, path + "/busbw");
    c.predicted_bytes_per_step = attr_double(g, path, "predicted_bytes_per_step");
    const std::string per_rank = path + "/predicted_bytes_per_rank";
    if (has_link(file, per_rank)) {
      c.predicted_bytes_per_rank = dataset_doubles(file, per_rank, &dims);
      expect_rows(dims, {hsize_t(r.ranks)}, per_rank, "ranks");
    }
  }
}

void read_memory_and_summary(hid_t file, RunRecord& r) {
  Group memory = open_group(file, "/memory");
  r.memory_tags = attr_strings(memory, "/memory", "tags");
  std::vector<hsize_t> dims;
  const hsize_t ranks = r.ranks, tags = r.memory_tags.size();
  r.peak_bytes = dataset_doubles(file, "/memory/peak_bytes", &dims);
  expect_rows(dims, {ranks, tags}, "/memory/peak_bytes", "ranks x tags");
  r.predicted_bytes = dataset_doubles(file, "/memory/predicted_bytes", &dims);
  expect_rows(dims, {tags}, "/memory/predicted_bytes", "tags");
  r.predicted_bytes_per_rank = dataset_doubles(file, "/memory/predicted_bytes_per_rank", &dims);
  expect_rows(dims, {ranks, tags}, "/memory/predicted_bytes_per_rank", "ranks x tags");
  r.process_peak_bytes = dataset_doubles(file, "/memory/process_peak_bytes", &dims);
  expect_rows(dims, {ranks}, "/memory/process_peak_bytes", "ranks");
  // Absent in files written before they existed: left empty (unknown).
  if (has_link(file, "/memory/baseline_bytes")) {
    r.baseline_bytes = dataset_doubles(file, "/memory/baseline_bytes", &dims);
    expect_rows(dims, {ranks}, "/memory/baseline_bytes", "ranks");
  }
  if (has_link(file, "/memory/tracked_peak_bytes")) {
    r.tracked_peak_bytes = dataset_doubles(file, "/memory/tracked_peak_bytes", &dims);
    expect_rows(dims, {ranks}, "/memory/tracked_peak_bytes", "ranks");
  }
  if (has_link(file, "/memory/device_peak_bytes")) {  // GPU runs only
    r.device_peak_bytes = dataset_doubles(file, "/memory/device_peak_bytes", &dims);
    expect_rows(dims, {ranks}, "/memory/device_peak_bytes", "ranks");
  }

  // Numeric attributes are the measures; each has a string "<name>.unit" beside it.
  Group summary = open_group(file, "/summary");
  for (const auto& name : attr_names(summary, "/summary")) {
    Attribute a = open_attr(summary, "/summary", name);
    Type t(check(H5Aget_type(a), "get type of attribute '" + name + "' of '/summary'"));
    if (H5Tget_class(t) == H5T_STRING) continue;
    const double value = attr_double(summary, "/summary", name);
    r.summary.push_back({name, value, attr_string(summary, "/summary", name + ".unit")});
  }
}

// /provenance/topology/<host>, one group per host (none in files from before it): string
// attributes as text, numeric ones as whole numbers, in the file's order.
std::vector<NodeTopology> read_topology(hid_t file) {
  std::vector<NodeTopology> nodes;
  if (!has_link(file, "/provenance/topology")) return nodes;
  const std::string top = "/provenance/topology";
  Group all = open_group(file, top);
  for (const std::string& host : link_names(all, top)) {
    const std::string path = top + "/" + host;
    Group g = open_group(file, path);
    NodeTopology& node = nodes.emplace_back();
    node.host = host;
    for (const std::string& name : attr_names(g, path)) {
      const std::string what = "attribute '" + name + "' of '" + path + "'";
      Attribute a = open_attr(g, path, name);
      Type t(check(H5Aget_type(a), "get type of " + what));
      if (H5Tget_class(t) == H5T_STRING) {
        node.text.emplace_back(name, attr_string(g, path, name));
        continue;
      }
      const double v = attr_double(g, path, name);
      if (!(std::fabs(v) < 9e18 && v == std::floor(v)))
        throw Error(what + " is not a whole number", kDamagedHint);
      node.numbers.emplace_back(name, static_cast<std::int64_t>(v));
    }
  }
  return nodes;
}

RunRecord read_contents(hid_t file) {
  if (check(H5Aexists(file, "schema"), "look up attribute 'schema' of '/'") <= 0)
    throw Error("not a strata run file (no 'schema' attribute on '/')", kDamagedHint);
  const std::string schema = attr_string(file, "/", "schema");
  if (std::find(std::begin(kRunSchemasRead), std::end(kRunSchemasRead), schema) ==
      std::end(kRunSchemasRead))
    throw Error("schema is '" + schema + "', expected 'strata-run/1' or '" + kRunSchema + "'",
                "the file was written by another tool or another strata version");
  RunRecord r;
  r.run_id = attr_string(file, "/", "run_id");
  r.status = attr_string(file, "/", "status");
  r.error = attr_string(file, "/", "error");
  r.created_utc = attr_string(file, "/", "created_utc");
  r.command_line = attr_string(file, "/", "command_line");
  read_config(file, r);
  r.provenance = string_attrs(file, "/provenance");
  r.hostnames = dataset_strings(file, "/provenance/hostnames");
  r.topology = read_topology(file);
  read_steps_and_comm(file, r);
  if (!r.hostnames.empty() && r.hostnames.size() != std::size_t(r.ranks))
    throw Error("dataset '/provenance/hostnames' holds " + std::to_string(r.hostnames.size()) +
                    " names for " + std::to_string(r.ranks) + " ranks",
                kDamagedHint);
  read_memory_and_summary(file, r);
  if (has_link(file, "/trace")) {
    std::vector<hsize_t> dims;
    const auto rank = dataset_doubles(file, "/trace/rank", &dims);
    const auto t0 = dataset_doubles(file, "/trace/t0", &dims);
    const auto t1 = dataset_doubles(file, "/trace/t1", &dims);
    const auto bytes = dataset_doubles(file, "/trace/bytes", &dims);
    const auto stream = dataset_strings(file, "/trace/stream"),
               kind = dataset_strings(file, "/trace/kind"),
               name = dataset_strings(file, "/trace/name");
    const std::size_t n = table_rows("/trace", {rank.size(), t0.size(), t1.size(), bytes.size(),
                                                stream.size(), kind.size(), name.size()});
    for (std::size_t i = 0; i < n; ++i)
      r.trace.push_back({whole_number(rank[i], "a value of dataset '/trace/rank'"), stream[i],
                         kind[i], name[i], t0[i], t1[i], bytes[i]});
  }
  if (has_link(file, "/calibration")) {
    std::vector<hsize_t> dims;
    const auto group = dataset_strings(file, "/calibration/group"),
               op = dataset_strings(file, "/calibration/op");
    const auto ranks_of = dataset_doubles(file, "/calibration/ranks", &dims);
    const auto bytes = dataset_doubles(file, "/calibration/bytes", &dims);
    const auto time_s = dataset_doubles(file, "/calibration/time_s", &dims);
    const auto algbw = dataset_doubles(file, "/calibration/algbw", &dims);
    const auto busbw = dataset_doubles(file, "/calibration/busbw", &dims);
    const std::size_t n =
        table_rows("/calibration", {group.size(), op.size(), ranks_of.size(), bytes.size(),
                                    time_s.size(), algbw.size(), busbw.size()});
    for (std::size_t i = 0; i < n; ++i)
      r.calibration.push_back(
          {group[i], op[i], ranks_of[i], bytes[i], time_s[i], algbw[i], busbw[i]});
  }
  return r;
}

}  // namespace

RunRecord read_run_file(const std::string& path) {
  const std::string prefix = "cannot read run file '" + path + "': ";
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw Error(prefix + "no such file", "check the path (a run that never ended writes no file)");
  if (!fs::is_regular_file(path, ec)) throw Error(prefix + "not a regular file");
  try {
    QuietErrors quiet;  // outlives the file handle
#if H5_VERSION_GE(1, 12, 0)
    const htri_t is_hdf5 = H5Fis_accessible(path.c_str(), H5P_DEFAULT);
#else
    const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
#endif
    if (is_hdf5 <= 0)
      throw Error("not an HDF5 file", "strata run files are HDF5 files written by the runner");
    File file(check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "open HDF5 file"));
    return read_contents(file);
  } catch (const std::exception& e) {
    const auto* err = dynamic_cast<const Error*>(&e);
    throw Error(prefix + e.what(), err ? err->hint() : kDamagedHint);
  }
}

}  // namespace strata
