// Writes one run file (schema strata-run/1.1, docs/architecture.md "Run file") atomically: the file
// is built under a temporary name in the target directory, closed, then renamed onto the real name.
#include <fcntl.h>
#include <hdf5_hl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include "results/hdf5_util.hpp"
#include "results/run_record.hpp"
#include "results/temporary_file.hpp"

namespace strata {
namespace {

using namespace h5;
namespace fs = std::filesystem;

const char* const kRecordHint = "the RunRecord is inconsistent: a bug in the code that filled it";

// Property list of `cls` (group or file creation) tracking and indexing links and attributes in
// creation order, so that readers get /config and /provenance attributes back in order.
PropList ordered_plist(hid_t cls) {
  PropList p(check(H5Pcreate(cls), "create property list"));
  const unsigned flags = H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED;
  check(H5Pset_link_creation_order(p, flags), "set link creation order");
  check(H5Pset_attr_creation_order(p, flags), "set attribute creation order");
  return p;
}

Group make_group(hid_t file, const std::string& path) {
  PropList gcpl = ordered_plist(H5P_GROUP_CREATE);
  return Group(check(H5Gcreate2(file, path.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT),
                     "create group '" + path + "'"));
}

// A metric or op name becomes an HDF5 link name: it must be one path component.
const std::string& link_name(const std::string& name, const char* what) {
  if (name.empty() || name == "." || name.find('/') != std::string::npos)
    throw Error(std::string(what) + " name '" + name + "' cannot be an HDF5 object name",
                "use a non-empty name without '/'");
  return name;
}

// Simple dataspace with `dims` (zero-sized dimensions allowed).
Space make_space(const std::vector<hsize_t>& dims) {
  return Space(check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                     "create dataspace"));
}

std::vector<const char*> c_strings(const std::vector<std::string>& v, const std::string& obj) {
  std::vector<const char*> out;
  for (const auto& s : v) {
    if (s.find('\0') != std::string::npos)
      throw Error(obj + " contains a NUL character", kRecordHint);
    out.push_back(s.c_str());
  }
  return out;
}

// Attribute `name` on `obj` (at HDF5 path `obj_path`, for messages) holding the `n` values of
// `data`, of `mem_type` in memory and `file_type` in the file.
void put_attr(hid_t obj, const std::string& obj_path, const std::string& name, hid_t file_type,
              hid_t mem_type, const Space& space, const void* data, std::size_t n) {
  const std::string what = "attribute '" + name + "' of '" + obj_path + "'";
  Attribute a(check(H5Acreate2(obj, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT),
                    "create " + what, "names must be unique (config keys, summary measures)"));
  if (n > 0) check(H5Awrite(a, mem_type, data), "write " + what);
  check(a.close(), "close " + what);
}

void attr_string(hid_t obj, const std::string& obj_path, const std::string& name,
                 const std::string& value) {
  if (value.find('\0') != std::string::npos)
    throw Error("attribute '" + name + "' of '" + obj_path + "' contains a NUL character",
                kRecordHint);
  const char* p = value.c_str();
  Space scalar(check(H5Screate(H5S_SCALAR), "create dataspace"));
  Type t = vlen_string_type();
  put_attr(obj, obj_path, name, t, t, scalar, &p, 1);
}

void attr_strings(hid_t obj, const std::string& obj_path, const std::string& name,
                  const std::vector<std::string>& values) {
  const auto p = c_strings(values, "attribute '" + name + "' of '" + obj_path + "'");
  Type t = vlen_string_type();
  put_attr(obj, obj_path, name, t, t, make_space({p.size()}), p.data(), p.size());
}

void attr_int(hid_t obj, const std::string& obj_path, const std::string& name, long long value) {
  Space scalar(check(H5Screate(H5S_SCALAR), "create dataspace"));
  put_attr(obj, obj_path, name, H5T_STD_I64LE, H5T_NATIVE_LLONG, scalar, &value, 1);
}

void attr_double(hid_t obj, const std::string& obj_path, const std::string& name, double value) {
  Space scalar(check(H5Screate(H5S_SCALAR), "create dataspace"));
  put_attr(obj, obj_path, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, scalar, &value, 1);
}

void attr_bool(hid_t obj, const std::string& obj_path, const std::string& name, bool value) {
  Space scalar(check(H5Screate(H5S_SCALAR), "create dataspace"));
  const signed char v = value ? 1 : 0;
  Type t = bool_type();
  put_attr(obj, obj_path, name, t, t, scalar, &v, 1);
}

// Counts are whole numbers; floating-point sums may leave them a rounding error away. Values that
// are unknown (NaN: a rank that never reported) or beyond int64 cannot be counts: false then, and
// the caller keeps float64.
bool as_counts(const std::vector<double>& v, std::vector<long long>* out) {
  out->clear();
  for (double x : v) {
    if (!std::isfinite(x) || std::fabs(x) >= 9.2e18) return false;
    out->push_back(std::llround(x));
  }
  return true;
}

// A measure of /summary (or another numeric attribute) with its unit: int64 when it counts.
void attr_measure(hid_t obj, const std::string& obj_path, const std::string& name, double value,
                  const std::string& unit) {
  std::vector<long long> count;
  if (is_count_unit(unit) && as_counts({value}, &count))
    attr_int(obj, obj_path, name, count[0]);
  else
    attr_double(obj, obj_path, name, value);
}

// One /config value, stored with its type (RunRecord::config_types).
void attr_config(hid_t config, const std::string& key, const std::string& text, ConfigType type) {
  const char* first = text.data();
  const char* last = first + text.size();
  const std::string what = "/config value '" + text + "' of '" + key + "'";
  if (type == ConfigType::integer) {
    long long v = 0;
    const auto [end, ec] = std::from_chars(first, last, v);
    if (ec != std::errc() || end != last || text.empty())
      throw Error(what + " is not an integer", kRecordHint);
    attr_int(config, "/config", key, v);
  } else if (type == ConfigType::real) {
    double v = 0;
    const auto [end, ec] = std::from_chars(first, last, v);
    if (ec != std::errc() || end != last || text.empty())
      throw Error(what + " is not a number", kRecordHint);
    attr_double(config, "/config", key, v);
  } else if (type == ConfigType::boolean) {
    if (text != "true" && text != "false") throw Error(what + " is not true or false", kRecordHint);
    attr_bool(config, "/config", key, text == "true");
  } else {
    attr_string(config, "/config", key, text);
  }
}

// Dataset at `path` with `dims` and a "unit" attribute. `file_type`/`mem_type` describe `data`.
void put_dataset(hid_t file, const std::string& path, const std::vector<hsize_t>& dims,
                 hid_t file_type, hid_t mem_type, const void* data, std::size_t n,
                 const std::string& unit) {
  const std::string what = "dataset '" + path + "'";
  Dataset d(check(H5Dcreate2(file, path.c_str(), file_type, make_space(dims), H5P_DEFAULT,
                             H5P_DEFAULT, H5P_DEFAULT),
                  "create " + what));
  if (n > 0) check(H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "write " + what);
  attr_string(d, path, "unit", unit);
  check(d.close(), "close " + what);
}

void dataset_doubles(hid_t file, const std::string& path, const std::vector<double>& v,
                     const std::vector<hsize_t>& dims, const std::string& unit) {
  std::size_t n = 1;
  std::string shape;
  for (hsize_t d : dims) {
    n *= d;
    shape += (shape.empty() ? "" : " x ") + std::to_string(d);
  }
  if (v.size() != n)
    throw Error("'" + path + "' has " + std::to_string(v.size()) + " values, expected " + shape,
                kRecordHint);
  std::vector<long long> counts;
  if (is_count_unit(unit) && as_counts(v, &counts))
    put_dataset(file, path, dims, H5T_STD_I64LE, H5T_NATIVE_LLONG, counts.data(), n, unit);
  else
    put_dataset(file, path, dims, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, v.data(), n, unit);
}

void dataset_strings(hid_t file, const std::string& path, const std::vector<std::string>& v,
                     const std::string& unit) {
  const auto p = c_strings(v, "dataset '" + path + "'");
  Type t = vlen_string_type();
  put_dataset(file, path, {p.size()}, t, t, p.data(), p.size(), unit);
}

// One field of every row of a table (/trace, /calibration), as a column to write.
template <class Row, class Field>
auto column(const std::vector<Row>& rows, Field field) {
  std::vector<std::decay_t<decltype(field(rows.front()))>> out;
  out.reserve(rows.size());
  for (const Row& row : rows) out.push_back(field(row));
  return out;
}

// Rows of an optional per-rank matrix: 0 when the record left it empty.
hsize_t rows(const std::vector<double>& v, hsize_t ranks) { return v.empty() ? 0 : ranks; }

// /, /config, /provenance.
void write_header(hid_t file, const RunRecord& r) {
  const hsize_t ranks = r.ranks;
  attr_string(file, "/", "schema", kRunSchema);
  attr_string(file, "/", "run_id", r.run_id);
  attr_string(file, "/", "status", r.status);
  attr_string(file, "/", "error", r.error);
  attr_string(file, "/", "created_utc", r.created_utc);
  attr_string(file, "/", "command_line", r.command_line);

  Group config = make_group(file, "/config");
  for (const auto& [key, value] : r.config) {
    const auto type = r.config_types.find(key);
    attr_config(config, key, value, type == r.config_types.end() ? ConfigType::text : type->second);
  }

  Group prov = make_group(file, "/provenance");
  for (const auto& [key, value] : r.provenance) attr_string(prov, "/provenance", key, value);
  if (!r.hostnames.empty() && r.hostnames.size() != ranks)
    throw Error(
        std::to_string(r.hostnames.size()) + " hostnames for " + std::to_string(ranks) + " ranks",
        kRecordHint);
  dataset_strings(file, "/provenance/hostnames", r.hostnames, "");
}

// /provenance/topology/<host>: one group per distinct host, its numbers as int64 attributes and
// its text as string attributes (topology.hpp); /provenance's topology_summary has them in words.
void write_topology(hid_t file, const RunRecord& r) {
  if (r.topology.empty()) return;
  Group all = make_group(file, "/provenance/topology");
  for (const NodeTopology& node : r.topology) {
    const std::string path = "/provenance/topology/" + link_name(node.host, "host");
    Group g = make_group(file, path);
    for (const auto& [key, value] : node.numbers) attr_int(g, path, key, value);
    for (const auto& [key, value] : node.text) attr_string(g, path, key, value);
  }
}

// /steps: every metric [ranks x steps], with its shape also as attributes.
void write_steps(hid_t file, const RunRecord& r) {
  const hsize_t ranks = r.ranks, steps = r.steps;
  Group step_group = make_group(file, "/steps");
  // The shape, also for a run that recorded no metric (e.g. one that failed at start-up).
  attr_int(step_group, "/steps", "ranks", r.ranks);
  attr_int(step_group, "/steps", "steps", r.steps);
  attr_strings(step_group, "/steps", "metrics", r.step_metrics);
  for (const auto& m : r.step_metrics) {
    const auto values = r.step_values.find(m);
    const auto unit = r.step_units.find(m);
    if (values == r.step_values.end() || unit == r.step_units.end())
      throw Error("step metric '" + m + "' has no values or no unit", kRecordHint);
    const std::string path = "/steps/" + link_name(m, "step metric");
    dataset_doubles(file, path, values->second, {ranks, steps}, unit->second);
  }
}

// /comm/<op>: the series of every collective used or predicted.
void write_comm(hid_t file, const RunRecord& r) {
  const hsize_t ranks = r.ranks, steps = r.steps;
  const Group comm = make_group(file, "/comm");
  for (const auto& [op, series] : r.comm) {
    const std::string path = "/comm/" + link_name(op, "comm op");
    Group g = make_group(file, path);
    dataset_doubles(file, path + "/calls", series.calls, {ranks, steps}, "count");
    dataset_doubles(file, path + "/bytes", series.bytes, {ranks, steps}, "bytes");
    dataset_doubles(file, path + "/time_s", series.time_s, {ranks, steps}, "s");
    dataset_doubles(file, path + "/algbw", series.algbw, {ranks, steps}, "bytes/s");
    dataset_doubles(file, path + "/busbw", series.busbw, {ranks, steps}, "bytes/s");
    attr_measure(g, path, "predicted_bytes_per_step", series.predicted_bytes_per_step, "bytes");
    attr_string(g, path, "predicted_bytes_per_step.unit", "bytes");
    dataset_doubles(file, path + "/predicted_bytes_per_rank", series.predicted_bytes_per_rank,
                    {rows(series.predicted_bytes_per_rank, ranks)}, "bytes");
  }
}

// /trace and /calibration (only when recorded): one 1-D dataset per field, one row per event.
void write_events(hid_t file, const RunRecord& r) {
  if (!r.trace.empty()) {
    Group trace = make_group(file, "/trace");
    const hsize_t n = r.trace.size();
    const auto& t = r.trace;
    dataset_doubles(file, "/trace/rank", column(t, [](auto& e) { return double(e.rank); }), {n},
                    "rank");
    dataset_strings(file, "/trace/stream", column(t, [](auto& e) { return e.stream; }), "");
    dataset_strings(file, "/trace/kind", column(t, [](auto& e) { return e.kind; }), "");
    dataset_strings(file, "/trace/name", column(t, [](auto& e) { return e.name; }), "");
    dataset_doubles(file, "/trace/t0", column(t, [](auto& e) { return e.t0; }), {n}, "s");
    dataset_doubles(file, "/trace/t1", column(t, [](auto& e) { return e.t1; }), {n}, "s");
    dataset_doubles(file, "/trace/bytes", column(t, [](auto& e) { return e.bytes; }), {n}, "bytes");
  }
  if (!r.calibration.empty()) {
    Group cal = make_group(file, "/calibration");
    const hsize_t n = r.calibration.size();
    const auto& c = r.calibration;
    dataset_strings(file, "/calibration/group", column(c, [](auto& p) { return p.group; }), "");
    dataset_strings(file, "/calibration/op", column(c, [](auto& p) { return p.op; }), "");
    dataset_doubles(file, "/calibration/ranks", column(c, [](auto& p) { return p.ranks; }), {n},
                    "ranks");
    dataset_doubles(file, "/calibration/bytes", column(c, [](auto& p) { return p.bytes; }), {n},
                    "bytes");
    dataset_doubles(file, "/calibration/time_s", column(c, [](auto& p) { return p.time_s; }), {n},
                    "s");
    dataset_doubles(file, "/calibration/algbw", column(c, [](auto& p) { return p.algbw; }), {n},
                    "bytes/s");
    dataset_doubles(file, "/calibration/busbw", column(c, [](auto& p) { return p.busbw; }), {n},
                    "bytes/s");
  }
}

// /memory. Matrices may be left empty (not measured): they are then written with 0 rows.
void write_memory(hid_t file, const RunRecord& r) {
  const hsize_t ranks = r.ranks;
  Group memory = make_group(file, "/memory");
  attr_strings(memory, "/memory", "tags", r.memory_tags);
  const hsize_t tags = r.memory_tags.size();
  dataset_doubles(file, "/memory/peak_bytes", r.peak_bytes, {rows(r.peak_bytes, ranks), tags},
                  "bytes");
  dataset_doubles(file, "/memory/predicted_bytes", r.predicted_bytes,
                  {r.predicted_bytes.empty() ? 0 : tags}, "bytes");
  dataset_doubles(file, "/memory/predicted_bytes_per_rank", r.predicted_bytes_per_rank,
                  {rows(r.predicted_bytes_per_rank, ranks), tags}, "bytes");
  dataset_doubles(file, "/memory/process_peak_bytes", r.process_peak_bytes,
                  {rows(r.process_peak_bytes, ranks)}, "bytes");
  dataset_doubles(file, "/memory/baseline_bytes", r.baseline_bytes, {rows(r.baseline_bytes, ranks)},
                  "bytes");
  dataset_doubles(file, "/memory/tracked_peak_bytes", r.tracked_peak_bytes,
                  {rows(r.tracked_peak_bytes, ranks)}, "bytes");
  if (!r.device_peak_bytes.empty())
    dataset_doubles(file, "/memory/device_peak_bytes", r.device_peak_bytes,
                    {rows(r.device_peak_bytes, ranks)}, "bytes");
}

// The dimension scale /<name>: int64 0, 1, ..., n - 1.
void make_scale(hid_t file, const std::string& name, hsize_t n, const std::string& unit) {
  std::vector<long long> index(n);
  for (hsize_t i = 0; i < n; ++i) index[i] = static_cast<long long>(i);
  const std::string path = "/" + name;
  put_dataset(file, path, {n}, H5T_STD_I64LE, H5T_NATIVE_LLONG, index.data(), n, unit);
  Dataset d(check(H5Dopen2(file, path.c_str(), H5P_DEFAULT), "open dataset '" + path + "'"));
  check(H5DSset_scale(d, name.c_str()), "make '" + path + "' a dimension scale");
}

// Labels the dimensions of dataset `path` with `names` ("" leaves one unlabelled) and attaches
// the scale of each name that has one (/rank, /step) where the sizes agree (a matrix written
// with no rows gets the label only).
void attach_scales(hid_t file, const std::string& path, const std::vector<std::string>& names) {
  if (!check(H5Lexists(file, path.c_str(), H5P_DEFAULT), "look up '" + path + "'")) return;
  Dataset d(check(H5Dopen2(file, path.c_str(), H5P_DEFAULT), "open dataset '" + path + "'"));
  Space space(check(H5Dget_space(d), "get dataspace of '" + path + "'"));
  std::vector<hsize_t> dims(names.size());
  if (check(H5Sget_simple_extent_ndims(space), "get rank of '" + path + "'") != int(names.size()))
    throw Error("'" + path + "' does not have " + std::to_string(names.size()) + " dimensions",
                kRecordHint);
  check(H5Sget_simple_extent_dims(space, dims.data(), nullptr), "get dims of '" + path + "'");
  for (unsigned i = 0; i < names.size(); ++i) {
    if (names[i].empty()) continue;
    const std::string what = "dimension " + std::to_string(i) + " of '" + path + "'";
    check(H5DSset_label(d, i, names[i].c_str()), "label " + what);
    const std::string scale_path = "/" + names[i];
    if (H5Lexists(file, scale_path.c_str(), H5P_DEFAULT) <= 0) continue;  // tag: no scale
    Dataset scale(check(H5Dopen2(file, scale_path.c_str(), H5P_DEFAULT), "open " + scale_path));
    Space scale_space(check(H5Dget_space(scale), "get dataspace of " + scale_path));
    if (hsize_t(H5Sget_simple_extent_npoints(scale_space)) != dims[i]) continue;
    check(H5DSattach_scale(d, scale, i), "attach " + scale_path + " to " + what);
  }
}

// /rank and /step, attached to every per-rank and per-step dataset.
void write_scales(hid_t file, const RunRecord& r) {
  make_scale(file, "rank", hsize_t(r.ranks), "rank");
  make_scale(file, "step", hsize_t(r.steps), "step");
  for (const auto& m : r.step_metrics) attach_scales(file, "/steps/" + m, {"rank", "step"});
  for (const auto& [op, series] : r.comm) {
    for (const char* field : {"calls", "bytes", "time_s", "algbw", "busbw"})
      attach_scales(file, "/comm/" + op + "/" + field, {"rank", "step"});
    attach_scales(file, "/comm/" + op + "/predicted_bytes_per_rank", {"rank"});
  }
  for (const char* m : {"peak_bytes", "predicted_bytes_per_rank"})
    attach_scales(file, std::string("/memory/") + m, {"rank", "tag"});
  attach_scales(file, "/memory/predicted_bytes", {"tag"});
  for (const char* m :
       {"process_peak_bytes", "baseline_bytes", "tracked_peak_bytes", "device_peak_bytes"})
    attach_scales(file, std::string("/memory/") + m, {"rank"});
  attach_scales(file, "/provenance/hostnames", {"rank"});
}

void write_contents(hid_t file, const RunRecord& r) {
  if (r.ranks < 0 || r.steps < 0)
    throw Error("negative shape: ranks = " + std::to_string(r.ranks) +
                    ", steps = " + std::to_string(r.steps),
                kRecordHint);
  write_header(file, r);
  write_topology(file, r);
  write_steps(file, r);
  write_comm(file, r);
  write_events(file, r);
  write_memory(file, r);
  write_scales(file, r);
  Group summary = make_group(file, "/summary");
  for (const auto& m : r.summary) {
    attr_measure(summary, "/summary", m.name, m.value, m.unit);
    attr_string(summary, "/summary", m.name + ".unit", m.unit);
  }
}

// The whole file as bytes: HDF5 builds it in memory (the core driver without a backing store) and
// never touches the disk, so a full disk or a lost mount fails our own write() below, not inside
// the library (whose state after a failed close crashed the process at exit).
std::vector<char> file_image(const RunRecord& record) {
  QuietErrors quiet;  // outlives every handle below
  PropList fcpl = ordered_plist(H5P_FILE_CREATE);
  PropList fapl(check(H5Pcreate(H5P_FILE_ACCESS), "create file access property list"));
  check(H5Pset_fapl_core(fapl, 1 << 20, /*backing_store=*/0), "use the in-memory file driver");
  // SEMI: closing fails if an object is still open, so a successful close means a complete file.
  check(H5Pset_fclose_degree(fapl, H5F_CLOSE_SEMI), "set file close degree");
  File file(check(H5Fcreate(("strata-run-" + record.run_id).c_str(), H5F_ACC_TRUNC, fcpl, fapl),
                  "create the in-memory HDF5 file"));
  write_contents(file, record);
  check(H5Fflush(file, H5F_SCOPE_GLOBAL), "flush the in-memory HDF5 file");
  const ssize_t size = H5Fget_file_image(file, nullptr, 0);
  if (size <= 0) throw Error("cannot get the HDF5 file image", kRecordHint);
  std::vector<char> image(std::size_t(size), 0);
  if (H5Fget_file_image(file, image.data(), image.size()) != size)
    throw Error("cannot get the HDF5 file image", kRecordHint);
  check(file.close(), "close the in-memory HDF5 file");
  return image;
}

// Write `bytes` to a new file at `path` and make them durable; throws naming the system error.
void write_bytes(int fd, const std::string& path, const std::vector<char>& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error("write '" + path + "': " + std::strerror(n < 0 ? errno : EIO));
    done += std::size_t(n);
  }
}

}  // namespace

void write_run_file(const RunRecord& record, const std::string& path, bool replace) {
  const fs::path target(path);
  const std::string prefix = "cannot write run file '" + path + "': ";
  if (!target.has_filename())
    throw Error(prefix + "the path names a directory", "give a file name, e.g. runs/run.h5");
  const fs::path dir = target.parent_path();
  try {
    if (!dir.empty()) fs::create_directories(dir);
    TemporaryFile tmp(path);
    write_bytes(tmp.fd(), tmp.path(), file_image(record));
    tmp.commit(replace);  // not replacing: an earlier file of that name stays (false)
  } catch (const std::exception& e) {
    const auto* err = dynamic_cast<const Error*>(&e);
    throw Error(prefix + e.what(),
                err && !err->hint().empty()
                    ? err->hint()
                    : "check that the directory can be created, is writable and has free space");
  }
}

}  // namespace strata
