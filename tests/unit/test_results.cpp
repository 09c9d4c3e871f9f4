// Run files (schema strata-run/1): round trip, on-disk layout checked with the raw HDF5 C API,
// atomic writes and the reader's errors.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <hdf5_hl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "results/run_record.hpp"
#include "results/temporary_file.hpp"
#include "run/summary.hpp"
#include "strata/types.hpp"

namespace {

namespace fs = std::filesystem;
using strata::RunRecord;

// Rows x cols values that differ everywhere and are not round in binary.
std::vector<double> matrix(int rows, int cols, double base) {
  std::vector<double> v;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) v.push_back(base + r * 10 + c + 1.0 / 3);
  return v;
}

// Rows x cols whole numbers that differ everywhere: counts (tokens, calls, bytes) are int64 on
// disk.
std::vector<double> counts(int rows, int cols, double base) {
  std::vector<double> v;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) v.push_back(base + r * 10 + c);
  return v;
}

RunRecord full_record() {
  RunRecord r;
  r.run_id = "gpt-small-dp2-20261122T024853Z";
  r.status = "ok";
  r.created_utc = "2026-11-22T02:48:53Z";
  r.command_line = "runner --model gpt-small --note \"a b\" --unit µs";
  const char* keys[] = {"transport", "model",       "batch",  "seq_len", "zero_stage",
                        "lr",        "dp",          "tp",     "pp",      "seed",
                        "dtype",     "steps",       "warmup", "backend", "optimizer",
                        "alpha",     "micro_batch", "trace",  "out",     "beta2"};
  for (int i = 0; i < 20; ++i) r.config.emplace_back(keys[i], "value-" + std::to_string(i * 7));
  r.config[3].second = "";  // an empty value survives too
  // Typed values: stored as int64, float64 and h5py's boolean; read back as the same text.
  using strata::ConfigType;
  r.config[11].second = "20";               // steps
  r.config[6].second = "-2";                // dp (any int64)
  r.config[9].second = "9007199254740991";  // seed
  r.config[5].second = "0.0003";            // lr
  r.config[15].second = "1e-300";           // alpha
  r.config[17].second = "true";             // trace
  r.config[13].second = "false";            // backend
  r.config_types = {{"steps", ConfigType::integer},  {"dp", ConfigType::integer},
                    {"seed", ConfigType::integer},   {"lr", ConfigType::real},
                    {"alpha", ConfigType::real},     {"trace", ConfigType::boolean},
                    {"backend", ConfigType::boolean}};
  r.provenance = {{"git_describe", "v0.1.0-3-gabc"},
                  {"compiler", "GCC 12.2.0"},
                  {"slurm_job_id", "4242"},
                  {"env.NCCL_DEBUG", "INFO"},
                  {"build_type", "Release"}};
  r.hostnames = {"node-a", "node-b"};
  r.ranks = 2;
  r.steps = 3;
  r.step_metrics = {"step_s", "forward_s", "loss", "tokens"};
  r.step_units = {{"step_s", "s"}, {"forward_s", "s"}, {"loss", "1"}, {"tokens", "tokens"}};
  double base = 0;
  for (const auto& m : r.step_metrics) r.step_values[m] = matrix(2, 3, base += 100);
  r.step_values["tokens"] = counts(2, 3, 512);
  r.comm["all_reduce"] = {counts(2, 3, 1), counts(2, 3, 1e6), matrix(2, 3, 1e-3),
                          4.5e6,           matrix(2, 3, 1e9), matrix(2, 3, 1.5e9)};
  r.comm["reduce_scatter"] = {counts(2, 3, 2), counts(2, 3, 2e6), matrix(2, 3, 2e-3),
                              1.25e6,          matrix(2, 3, 1e9), matrix(2, 3, 0.5e9)};
  r.memory_tags = {"params", "grads", "optimizer_state", "activations", "workspace", "comm"};
  r.peak_bytes = counts(2, 6, 1e9);
  r.predicted_bytes = counts(1, 6, 2e9);
  r.predicted_bytes_per_rank = counts(2, 6, 3e9);
  r.process_peak_bytes = {7.5e9, 7.25e9};
  r.baseline_bytes = {3.25e7, 3.5e7};
  r.tracked_peak_bytes = {7.4e9, 7.2e9};
  r.summary = {{"tokens_per_s", 12345.5, "tokens/s"},
               {"step_s_p50", 0.125, "s"},
               {"mfu", 0.41, "1"},
               {"peak_bytes_max", 8e9, "bytes"}};
  return r;
}

void expect_same(const RunRecord& a, const RunRecord& b) {
  EXPECT_EQ(a.run_id, b.run_id);
  EXPECT_EQ(a.status, b.status);
  EXPECT_EQ(a.error, b.error);
  EXPECT_EQ(a.created_utc, b.created_utc);
  EXPECT_EQ(a.command_line, b.command_line);
  EXPECT_EQ(a.config, b.config);
  EXPECT_EQ(a.config_types, b.config_types);
  EXPECT_EQ(a.provenance, b.provenance);
  EXPECT_EQ(a.hostnames, b.hostnames);
  EXPECT_EQ(a.ranks, b.ranks);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.step_metrics, b.step_metrics);
  EXPECT_EQ(a.step_units, b.step_units);
  EXPECT_EQ(a.step_values, b.step_values);
  ASSERT_EQ(a.comm.size(), b.comm.size());
  for (const auto& [op, s] : a.comm) {
    ASSERT_TRUE(b.comm.count(op)) << op;
    const auto& t = b.comm.at(op);
    EXPECT_EQ(s.calls, t.calls) << op;
    EXPECT_EQ(s.bytes, t.bytes) << op;
    EXPECT_EQ(s.time_s, t.time_s) << op;
    EXPECT_EQ(s.algbw, t.algbw) << op;
    EXPECT_EQ(s.busbw, t.busbw) << op;
    EXPECT_EQ(s.predicted_bytes_per_step, t.predicted_bytes_per_step) << op;
  }
  EXPECT_EQ(a.memory_tags, b.memory_tags);
  EXPECT_EQ(a.peak_bytes, b.peak_bytes);
  EXPECT_EQ(a.predicted_bytes, b.predicted_bytes);
  EXPECT_EQ(a.predicted_bytes_per_rank, b.predicted_bytes_per_rank);
  EXPECT_EQ(a.process_peak_bytes, b.process_peak_bytes);
  EXPECT_EQ(a.baseline_bytes, b.baseline_bytes);
  EXPECT_EQ(a.tracked_peak_bytes, b.tracked_peak_bytes);
  ASSERT_EQ(a.summary.size(), b.summary.size());
  for (std::size_t i = 0; i < a.summary.size(); ++i) {
    EXPECT_EQ(a.summary[i].name, b.summary[i].name);
    EXPECT_EQ(a.summary[i].value, b.summary[i].value);
    EXPECT_EQ(a.summary[i].unit, b.summary[i].unit);
  }
}

// The message of the strata::Error `f` throws ("" and a test failure when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const strata::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no strata::Error thrown";
  return {};
}

std::vector<std::string> dir_entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// --- raw HDF5 C API, independent of the reader -------------------------------------------------

std::vector<std::string> raw_strings_attr(hid_t obj, const char* name) {
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  EXPECT_GE(a, 0) << name;
  hid_t space = H5Aget_space(a);
  std::vector<char*> p(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space)));
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  if (!p.empty()) {
    EXPECT_GE(H5Aread(a, t, p.data()), 0) << name;
  }
  std::vector<std::string> out;
  for (char* s : p) {
    out.emplace_back(s ? s : "");
    H5free_memory(s);
  }
  H5Tclose(t);
  H5Sclose(space);
  H5Aclose(a);
  return out;
}

std::vector<hsize_t> raw_dims(hid_t file, const char* path) {
  hid_t d = H5Dopen2(file, path, H5P_DEFAULT);
  EXPECT_GE(d, 0) << path;
  hid_t space = H5Dget_space(d);
  std::vector<hsize_t> dims(static_cast<std::size_t>(H5Sget_simple_extent_ndims(space)));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  H5Sclose(space);
  H5Dclose(d);
  return dims;
}

std::string raw_unit(hid_t file, const char* path) {
  hid_t d = H5Dopen2(file, path, H5P_DEFAULT);
  auto v = raw_strings_attr(d, "unit");
  H5Dclose(d);
  return v.size() == 1 ? v[0] : "<not one string>";
}

double raw_double_attr(hid_t file, const char* obj, const char* name) {
  double v = -1;
  hid_t a = H5Aopen_by_name(file, obj, name, H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(a, 0) << obj << " " << name;
  EXPECT_GE(H5Aread(a, H5T_NATIVE_DOUBLE, &v), 0);
  H5Aclose(a);
  return v;
}

std::vector<std::string> raw_attr_names_in_creation_order(hid_t file, const char* group) {
  std::vector<std::string> names;
  hid_t g = H5Gopen2(file, group, H5P_DEFAULT);
  hid_t gcpl = H5Gget_create_plist(g);
  unsigned flags = 0;
  EXPECT_GE(H5Pget_attr_creation_order(gcpl, &flags), 0);
  EXPECT_EQ(flags, unsigned{H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED}) << group;
  H5Pclose(gcpl);
  auto cb = [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->emplace_back(name);
    return 0;
  };
  EXPECT_GE(H5Aiterate2(g, H5_INDEX_CRT_ORDER, H5_ITER_INC, nullptr, cb, &names), 0);
  H5Gclose(g);
  return names;
}

// An HDF5 file whose "/" has a "schema" string attribute (none when `schema` is null).
void write_foreign_hdf5(const fs::path& path, const char* schema) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  if (schema) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, std::strlen(schema));  // fixed-length, as another tool may write it
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, "schema", t, s, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Awrite(a, t, schema), 0);
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
  }
  ASSERT_GE(H5Fclose(f), 0);
}

// --- edits of a valid run file, as the fuzzer (tests/fuzz/fuzz_run_file) makes them -------------

// Replaces the object at `path` by a float64 dataset of `dims` whose values are never written
// (its storage is not allocated: it reads back as fill values), with a "unit" attribute.
void replace_by_unwritten_dataset(const fs::path& file, const char* path, std::vector<hsize_t> dims,
                                  bool write_first_chunk = false) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, path, H5P_DEFAULT), 0) << path;
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  std::vector<hsize_t> chunk(dims.size(), 4);
  if (write_first_chunk) H5Pset_chunk(dcpl, int(chunk.size()), chunk.data());
  hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  hid_t d = H5Dcreate2(f, path, H5T_IEEE_F64LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(d, 0) << path;
  if (write_first_chunk) {  // one chunk of 4 x 4 values: the others stay unallocated
    const std::vector<hsize_t> start(dims.size(), 0);
    H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, chunk.data(), nullptr);
    hid_t mem = H5Screate_simple(int(chunk.size()), chunk.data(), nullptr);
    const std::vector<double> values(16, 1.0);
    EXPECT_GE(H5Dwrite(d, H5T_NATIVE_DOUBLE, mem, space, H5P_DEFAULT, values.data()), 0);
    H5Sclose(mem);
  }
  hid_t str = H5Tcopy(H5T_C_S1);
  H5Tset_size(str, H5T_VARIABLE);
  hid_t scalar = H5Screate(H5S_SCALAR);
  hid_t unit = H5Acreate2(d, "unit", str, scalar, H5P_DEFAULT, H5P_DEFAULT);
  const char* s = "s";
  EXPECT_GE(H5Awrite(unit, str, &s), 0);
  H5Aclose(unit);
  H5Sclose(scalar);
  H5Tclose(str);
  H5Sclose(space);
  H5Pclose(dcpl);
  H5Dclose(d);
  ASSERT_GE(H5Fclose(f), 0);
}

// Replaces the object at `path` by a float64 dataset of `dims` holding `values`.
void replace_by_dataset(const fs::path& file, const char* path, std::vector<hsize_t> dims,
                        const std::vector<double>& values) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, path, H5P_DEFAULT), 0) << path;
  hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  hid_t d = H5Dcreate2(f, path, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(d, 0) << path;
  EXPECT_GE(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  H5Sclose(space);
  H5Dclose(d);
  ASSERT_GE(H5Fclose(f), 0);
}

// Rewrites the (numeric) attribute `name` of `obj` as a float64 scalar `value`.
void replace_double_attr(const fs::path& file, const char* obj, const char* name, double value) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Adelete_by_name(f, obj, name, H5P_DEFAULT), 0) << obj << " " << name;
  hid_t scalar = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate_by_name(f, obj, name, H5T_IEEE_F64LE, scalar, H5P_DEFAULT, H5P_DEFAULT,
                              H5P_DEFAULT);
  ASSERT_GE(a, 0);
  EXPECT_GE(H5Awrite(a, H5T_NATIVE_DOUBLE, &value), 0);
  H5Aclose(a);
  H5Sclose(scalar);
  ASSERT_GE(H5Fclose(f), 0);
}

class Results : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("strata_test_results_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(Results, RoundTripFullRecord) {
  const RunRecord in = full_record();
  strata::write_run_file(in, file("run.h5"));
  expect_same(in, strata::read_run_file(file("run.h5")));
}

TEST_F(Results, LayoutOnDisk) {
  strata::write_run_file(full_record(), file("run.h5"));
  hid_t f = H5Fopen(file("run.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  EXPECT_EQ(raw_strings_attr(f, "schema"), std::vector<std::string>{"strata-run/1.1"});
  EXPECT_EQ(raw_dims(f, "/steps/loss"), (std::vector<hsize_t>{2, 3}));
  EXPECT_EQ(raw_unit(f, "/steps/loss"), "1");
  EXPECT_EQ(raw_unit(f, "/steps/step_s"), "s");
  EXPECT_EQ(raw_dims(f, "/comm/all_reduce/bytes"), (std::vector<hsize_t>{2, 3}));
  EXPECT_EQ(raw_unit(f, "/comm/all_reduce/bytes"), "bytes");
  EXPECT_EQ(raw_unit(f, "/comm/all_reduce/calls"), "count");
  EXPECT_EQ(raw_unit(f, "/comm/all_reduce/time_s"), "s");
  EXPECT_EQ(raw_unit(f, "/comm/all_reduce/busbw"), "bytes/s");
  EXPECT_EQ(raw_double_attr(f, "/comm/all_reduce", "predicted_bytes_per_step"), 4.5e6);
  EXPECT_EQ(raw_dims(f, "/memory/peak_bytes"), (std::vector<hsize_t>{2, 6}));
  EXPECT_EQ(raw_dims(f, "/memory/predicted_bytes"), (std::vector<hsize_t>{6}));
  EXPECT_EQ(raw_dims(f, "/memory/process_peak_bytes"), (std::vector<hsize_t>{2}));
  EXPECT_EQ(raw_dims(f, "/memory/baseline_bytes"), (std::vector<hsize_t>{2}));
  EXPECT_EQ(raw_unit(f, "/memory/baseline_bytes"), "bytes");
  EXPECT_EQ(raw_dims(f, "/memory/tracked_peak_bytes"), (std::vector<hsize_t>{2}));
  EXPECT_EQ(raw_unit(f, "/memory/tracked_peak_bytes"), "bytes");
  EXPECT_EQ(raw_unit(f, "/memory/predicted_bytes_per_rank"), "bytes");
  EXPECT_EQ(raw_dims(f, "/provenance/hostnames"), (std::vector<hsize_t>{2}));
  hid_t memory = H5Gopen2(f, "/memory", H5P_DEFAULT);
  EXPECT_EQ(raw_strings_attr(memory, "tags"), full_record().memory_tags);
  H5Gclose(memory);
  hid_t summary = H5Gopen2(f, "/summary", H5P_DEFAULT);
  EXPECT_EQ(raw_strings_attr(summary, "tokens_per_s.unit"), std::vector<std::string>{"tokens/s"});
  H5Gclose(summary);
  EXPECT_EQ(raw_double_attr(f, "/summary", "tokens_per_s"), 12345.5);
  // /config attributes come back in insertion order through HDF5's own creation-order index.
  std::vector<std::string> keys;
  for (const auto& [k, v] : full_record().config) keys.push_back(k);
  EXPECT_EQ(raw_attr_names_in_creation_order(f, "/config"), keys);
  keys.clear();
  for (const auto& [k, v] : full_record().provenance) keys.push_back(k);
  EXPECT_EQ(raw_attr_names_in_creation_order(f, "/provenance"), keys);
  EXPECT_GE(H5Fclose(f), 0);
}

// The HDF5 type class and size of the dataset or attribute at `path` (attribute `attr` of it
// when given).
std::pair<H5T_class_t, std::size_t> raw_type(hid_t file, const char* path,
                                             const char* attr = nullptr) {
  hid_t obj = attr ? H5Aopen_by_name(file, path, attr, H5P_DEFAULT, H5P_DEFAULT)
                   : H5Dopen2(file, path, H5P_DEFAULT);
  EXPECT_GE(obj, 0) << path << " " << (attr ? attr : "");
  hid_t t = attr ? H5Aget_type(obj) : H5Dget_type(obj);
  const std::pair<H5T_class_t, std::size_t> out{H5Tget_class(t), H5Tget_size(t)};
  H5Tclose(t);
  attr ? H5Aclose(obj) : H5Dclose(obj);
  return out;
}

// strata-run/1.1: /config typed by ConfigType, counts int64, measures float64.
TEST_F(Results, TypedValuesOnDisk) {
  strata::write_run_file(full_record(), file("run.h5"));
  hid_t f = H5Fopen(file("run.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  using Kind = std::pair<H5T_class_t, std::size_t>;
  EXPECT_EQ(raw_type(f, "/config", "steps"), Kind(H5T_INTEGER, 8));
  EXPECT_EQ(raw_type(f, "/config", "lr"), Kind(H5T_FLOAT, 8));
  EXPECT_EQ(raw_type(f, "/config", "trace"), Kind(H5T_ENUM, 1));
  EXPECT_EQ(raw_type(f, "/config", "model").first, H5T_STRING);
  long long steps = 0;
  double lr = 0;
  hid_t a = H5Aopen_by_name(f, "/config", "steps", H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(H5Aread(a, H5T_NATIVE_LLONG, &steps), 0);
  H5Aclose(a);
  a = H5Aopen_by_name(f, "/config", "lr", H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(H5Aread(a, H5T_NATIVE_DOUBLE, &lr), 0);
  H5Aclose(a);
  EXPECT_EQ(steps, 20);
  EXPECT_EQ(lr, 3e-4);
  // h5py's boolean: an enum of int8 whose member TRUE is 1.
  a = H5Aopen_by_name(f, "/config", "trace", H5P_DEFAULT, H5P_DEFAULT);
  hid_t t = H5Aget_type(a);
  char name[8] = {};
  const signed char one = 1;
  EXPECT_GE(H5Tenum_nameof(t, &one, name, sizeof name), 0);
  EXPECT_STREQ(name, "TRUE");
  signed char value = 0;
  EXPECT_GE(H5Aread(a, t, &value), 0);
  EXPECT_EQ(value, 1);
  H5Tclose(t);
  H5Aclose(a);
  for (const char* p : {"/steps/tokens", "/comm/all_reduce/calls", "/comm/all_reduce/bytes",
                        "/memory/peak_bytes", "/memory/process_peak_bytes", "/rank", "/step"})
    EXPECT_EQ(raw_type(f, p), Kind(H5T_INTEGER, 8)) << p;
  for (const char* p : {"/steps/loss", "/steps/step_s", "/comm/all_reduce/time_s"})
    EXPECT_EQ(raw_type(f, p), Kind(H5T_FLOAT, 8)) << p;
  EXPECT_EQ(raw_type(f, "/summary", "peak_bytes_max"), Kind(H5T_INTEGER, 8));
  EXPECT_EQ(raw_type(f, "/summary", "tokens_per_s"), Kind(H5T_FLOAT, 8));
  EXPECT_EQ(raw_type(f, "/comm/all_reduce", "predicted_bytes_per_step"), Kind(H5T_INTEGER, 8));
  EXPECT_GE(H5Fclose(f), 0);
}

// /rank and /step are dimension scales attached to every [ranks x steps] and per-rank dataset.
TEST_F(Results, DimensionScalesAttached) {
  strata::write_run_file(full_record(), file("run.h5"));
  hid_t f = H5Fopen(file("run.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t rank = H5Dopen2(f, "/rank", H5P_DEFAULT), step = H5Dopen2(f, "/step", H5P_DEFAULT);
  EXPECT_GT(H5DSis_scale(rank), 0);
  EXPECT_GT(H5DSis_scale(step), 0);
  EXPECT_EQ(raw_dims(f, "/rank"), std::vector<hsize_t>{2});
  EXPECT_EQ(raw_dims(f, "/step"), std::vector<hsize_t>{3});
  auto label = [](hid_t d, unsigned dim) {
    char text[16] = {};
    H5DSget_label(d, dim, text, sizeof text);
    return std::string(text);
  };
  for (const char* p :
       {"/steps/loss", "/steps/tokens", "/comm/all_reduce/bytes", "/comm/reduce_scatter/time_s"}) {
    hid_t d = H5Dopen2(f, p, H5P_DEFAULT);
    EXPECT_GT(H5DSis_attached(d, rank, 0), 0) << p;
    EXPECT_GT(H5DSis_attached(d, step, 1), 0) << p;
    EXPECT_EQ(H5DSis_attached(d, step, 0), 0) << p;
    EXPECT_EQ(label(d, 0), "rank") << p;
    EXPECT_EQ(label(d, 1), "step") << p;
    H5Dclose(d);
  }
  for (const char* p :
       {"/memory/peak_bytes", "/memory/process_peak_bytes", "/provenance/hostnames"}) {
    hid_t d = H5Dopen2(f, p, H5P_DEFAULT);
    EXPECT_GT(H5DSis_attached(d, rank, 0), 0) << p;
    EXPECT_EQ(label(d, 0), "rank") << p;
    H5Dclose(d);
  }
  H5Dclose(rank);
  H5Dclose(step);
  EXPECT_GE(H5Fclose(f), 0);
}

// A strata-run/1 file (every /config value a string, counts float64, no scales) still reads.
TEST_F(Results, SchemaOneFileReads) {
  RunRecord old = full_record();
  old.config_types.clear();  // strata-run/1 stored every value as a string
  strata::write_run_file(old, file("old.h5"));
  hid_t f = H5Fopen(file("old.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Adelete(f, "schema"), 0);
  hid_t t = H5Tcopy(H5T_C_S1), scalar = H5Screate(H5S_SCALAR);
  H5Tset_size(t, H5T_VARIABLE);
  hid_t a = H5Acreate2(f, "schema", t, scalar, H5P_DEFAULT, H5P_DEFAULT);
  const char* schema = "strata-run/1";
  EXPECT_GE(H5Awrite(a, t, &schema), 0);
  H5Aclose(a);
  H5Sclose(scalar);
  H5Tclose(t);
  ASSERT_GE(H5Fclose(f), 0);
  replace_by_dataset(file("old.h5"), "/comm/all_reduce/calls", {2, 3},
                     old.comm["all_reduce"].calls);
  expect_same(old, strata::read_run_file(file("old.h5")));
}

TEST_F(Results, ZeroStepsRoundTrip) {
  RunRecord in = full_record();
  in.status = "failed";
  in.error = "out of memory while building the model at step 0";
  in.steps = 0;
  for (auto& [m, v] : in.step_values) v.clear();
  for (auto& [op, s] : in.comm) s = {{}, {}, {}, s.predicted_bytes_per_step};
  in.peak_bytes.clear();  // not measured
  in.summary.clear();
  strata::write_run_file(in, file("failed.h5"));
  const RunRecord out = strata::read_run_file(file("failed.h5"));
  expect_same(in, out);
  EXPECT_EQ(out.ranks, 2);
  EXPECT_FALSE(out.error.empty());

  hid_t f = H5Fopen(file("failed.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  EXPECT_EQ(raw_dims(f, "/steps/loss"), (std::vector<hsize_t>{2, 0}));
  EXPECT_EQ(raw_dims(f, "/memory/peak_bytes"), (std::vector<hsize_t>{0, 6}));
  H5Fclose(f);
}

// Files written before /memory/baseline_bytes and /memory/tracked_peak_bytes existed still read;
// the two come back empty (unknown) and everything else as written.
TEST_F(Results, FileWithoutBaselineReadsAsUnknown) {
  strata::write_run_file(full_record(), file("old.h5"));
  hid_t f = H5Fopen(file("old.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, "/memory/baseline_bytes", H5P_DEFAULT), 0);
  ASSERT_GE(H5Ldelete(f, "/memory/tracked_peak_bytes", H5P_DEFAULT), 0);
  ASSERT_GE(H5Fclose(f), 0);
  const RunRecord out = strata::read_run_file(file("old.h5"));
  EXPECT_TRUE(out.baseline_bytes.empty());
  EXPECT_TRUE(out.tracked_peak_bytes.empty());
  RunRecord want = full_record();
  want.baseline_bytes.clear();
  want.tracked_peak_bytes.clear();
  expect_same(want, out);
}

TEST_F(Results, EmptyRecordKeepsRanks) {
  RunRecord in;  // failed before anything was measured: no metric holds the shape
  in.status = "failed";
  in.error = "bad config";
  in.ranks = 4;
  strata::write_run_file(in, file("empty.h5"));
  expect_same(in, strata::read_run_file(file("empty.h5")));
}

TEST_F(Results, NoTemporaryFileRemains) {
  strata::write_run_file(full_record(), file("run.h5"));
  strata::write_run_file(full_record(), file("run.h5"));  // overwrite
  EXPECT_EQ(dir_entries(dir_), std::vector<std::string>{"run.h5"});
}

// kill -9 leaves temporary files, and a later process may have the dead one's pid: a stale one,
// under the old name or the new, is neither taken (the run would fail) nor deleted (not ours).
TEST_F(Results, StaleTemporaryFilesAreNeitherTakenNorDeleted) {
  const std::string pid = std::to_string(::getpid());
  for (const std::string& stale : {".run.h5.tmp-" + pid, ".run.h5.tmp-" + pid + "-00000000"})
    std::ofstream(dir_ / stale) << "left by a killed run\n";
  strata::write_run_file(full_record(), file("run.h5"));
  EXPECT_EQ(strata::read_run_file(file("run.h5")).run_id, full_record().run_id);
  EXPECT_EQ(dir_entries(dir_),
            (std::vector<std::string>{".run.h5.tmp-" + pid, ".run.h5.tmp-" + pid + "-00000000",
                                      "run.h5"}));
}

TEST_F(Results, TemporaryFileIsOursUntilCommitted) {
  std::string first;
  {
    strata::TemporaryFile a(file("t.json")), b(file("t.json"));
    EXPECT_NE(a.path(), b.path());
    first = a.path();
    ASSERT_EQ(::write(a.fd(), "x", 1), 1);
    EXPECT_TRUE(a.commit(false));   // nothing named t.json yet
    EXPECT_FALSE(b.commit(false));  // now there is: it stays, and b is not moved
  }                                 // b removed here
  EXPECT_FALSE(fs::exists(first));
  EXPECT_EQ(dir_entries(dir_), std::vector<std::string>{"t.json"});
  EXPECT_EQ(fs::file_size(file("t.json")), 1u);
}

TEST_F(Results, CreatesMissingDirectories) {
  const std::string path = file("study/dp2/run.h5");
  strata::write_run_file(full_record(), path);
  EXPECT_EQ(strata::read_run_file(path).run_id, full_record().run_id);
}

TEST_F(Results, UncreatableDirectoryThrowsAndLeavesNoFile) {
  std::ofstream(dir_ / "blocker") << "a regular file, not a directory\n";
  const std::string path = file("blocker/sub/run.h5");
  const std::string msg = error_of([&] { strata::write_run_file(full_record(), path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(dir_entries(dir_), std::vector<std::string>{"blocker"});
}

TEST_F(Results, FailedWriteKeepsOldFileAndRemovesTemporary) {
  const std::string path = file("run.h5");
  strata::write_run_file(full_record(), path);

  RunRecord bad = full_record();
  bad.run_id = "second";
  bad.step_values["loss"].pop_back();  // found while writing, after the temporary file exists
  std::string msg = error_of([&] { strata::write_run_file(bad, path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("/steps/loss"), std::string::npos) << msg;

  bad = full_record();
  bad.run_id = "third";
  bad.config.emplace_back("model", "twice");  // HDF5 itself refuses the duplicate attribute
  msg = error_of([&] { strata::write_run_file(bad, path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("'model'"), std::string::npos) << msg;

  EXPECT_EQ(dir_entries(dir_), std::vector<std::string>{"run.h5"});
  EXPECT_EQ(strata::read_run_file(path).run_id, full_record().run_id);
}

TEST_F(Results, ReadMissingFile) {
  const std::string path = file("absent.h5");
  const std::string msg = error_of([&] { strata::read_run_file(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("no such file"), std::string::npos) << msg;
}

TEST_F(Results, ReadTextFileQuietly) {
  const std::string path = file("notes.h5");
  std::ofstream(path) << "this is not HDF5\n";
  ::testing::internal::CaptureStderr();
  const std::string msg = error_of([&] { strata::read_run_file(path); });
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");  // no HDF5 error stack printed
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("not an HDF5 file"), std::string::npos) << msg;
  // HDF5's automatic error printing is back on afterwards.
  H5E_auto2_t func = nullptr;
  void* data = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &func, &data);
  EXPECT_NE(func, nullptr);
}

TEST_F(Results, ReadOtherSchema) {
  const std::string path = file("other.h5");
  write_foreign_hdf5(path, "other-tool/2");
  const std::string msg = error_of([&] { strata::read_run_file(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("other-tool/2"), std::string::npos) << msg;
}

TEST_F(Results, ReadHdf5WithoutSchema) {
  const std::string path = file("plain.h5");
  write_foreign_hdf5(path, nullptr);
  const std::string msg = error_of([&] { strata::read_run_file(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("schema"), std::string::npos) << msg;
}

TEST_F(Results, ReadTruncatedFile) {
  const std::string path = file("run.h5");
  strata::write_run_file(full_record(), path);
  fs::resize_file(path, fs::file_size(path) / 2);
  ::testing::internal::CaptureStderr();
  const std::string msg = error_of([&] { strata::read_run_file(path); });
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

// Reproducers of what fuzz_run_file found. A count stored as NaN, a huge or a negative number was
// converted to int (undefined behaviour; in practice a garbage shape or rank).
TEST_F(Results, ShapeAttributeThatIsNotACountIsRefused) {
  const std::string path = file("run.h5");
  for (double bad : {std::nan(""), 1e300, -1.0, 2.5}) {
    strata::write_run_file(full_record(), path);
    replace_double_attr(path, "/steps", "ranks", bad);
    const std::string msg = error_of([&] { strata::read_run_file(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("attribute 'ranks' of '/steps'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not a whole number"), std::string::npos) << msg;
  }
}

TEST_F(Results, TraceRankThatIsNotARankIsRefused) {
  RunRecord in = full_record();
  in.trace = {{0, "compute", "forward", "forward", 0.0, 1.0, 0},
              {1, "comm0", "all_reduce", "dp", 1.0, 2.0, 64}};
  const std::string path = file("run.h5");
  strata::write_run_file(in, path);
  EXPECT_EQ(strata::read_run_file(path).trace.at(1).rank, 1);
  for (double bad : {std::nan(""), -1.7976931348623157e308, 3e9}) {
    strata::write_run_file(in, path);
    replace_by_dataset(path, "/trace/rank", {2}, {0, bad});
    const std::string msg = error_of([&] { strata::read_run_file(path); });
    EXPECT_NE(msg.find("'/trace/rank'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not a whole number"), std::string::npos) << msg;
  }
}

// A dataset of 2^40 values that were never written costs the file a few bytes; the reader took
// its dims on trust and asked for 8 TiB. Refused, naming the dataset, before allocating.
TEST_F(Results, DatasetWhoseValuesAreNotStoredIsRefused) {
  const std::string path = file("run.h5");
  strata::write_run_file(full_record(), path);
  replace_by_unwritten_dataset(path, "/steps/loss", {hsize_t(1) << 20, hsize_t(1) << 20});
  std::string msg = error_of([&] { strata::read_run_file(path); });
  EXPECT_NE(msg.find("'/steps/loss' has 1099511627776 elements but none of them are stored"),
            std::string::npos)
      << msg;

  strata::write_run_file(full_record(), path);  // chunked, one chunk written
  replace_by_unwritten_dataset(path, "/memory/peak_bytes", {hsize_t(1) << 30, 6}, true);
  msg = error_of([&] { strata::read_run_file(path); });
  EXPECT_NE(msg.find("'/memory/peak_bytes' has 6442450944 elements but not all"), std::string::npos)
      << msg;
}

// The check tools index /memory, hostnames and predicted_bytes_per_rank by rank and tag; the reader
// returned whatever shape the file had.
TEST_F(Results, PerRankDatasetsOfTheWrongShapeAreRefused) {
  const std::string path = file("run.h5");
  const std::vector<double> values(18, 1.0);
  const struct {
    const char* dataset;
    std::vector<hsize_t> dims;
    const char* expected;
  } cases[] = {
      {"/memory/peak_bytes", {3, 6}, "'/memory/peak_bytes' is not [ranks x tags] = [2 x 6]"},
      {"/memory/peak_bytes", {12}, "'/memory/peak_bytes' is not [ranks x tags]"},
      {"/memory/predicted_bytes", {5}, "'/memory/predicted_bytes' is not [tags] = [6]"},
      {"/memory/predicted_bytes_per_rank", {2, 5}, "'/memory/predicted_bytes_per_rank' is not"},
      {"/memory/process_peak_bytes", {1}, "'/memory/process_peak_bytes' is not [ranks] = [2]"},
      {"/comm/all_reduce/predicted_bytes_per_rank",
       {3},
       "'/comm/all_reduce/predicted_bytes_per_rank' is not [ranks] = [2]"},
  };
  for (const auto& c : cases) {
    strata::write_run_file(full_record(), path);
    replace_by_dataset(path, c.dataset, c.dims, values);
    const std::string msg = error_of([&] { strata::read_run_file(path); });
    EXPECT_NE(msg.find(c.expected), std::string::npos) << c.dataset << ": " << msg;
  }
  RunRecord three;
  three.hostnames = {"a", "b", "c"};
  three.ranks = 3;
  strata::write_run_file(three, file("three.h5"));
  strata::write_run_file(full_record(), path);
  {  // /provenance/hostnames of the 3-rank file in the 2-rank one
    hid_t from = H5Fopen(file("three.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t to = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(H5Ldelete(to, "/provenance/hostnames", H5P_DEFAULT), 0);
    ASSERT_GE(H5Ocopy(from, "/provenance/hostnames", to, "/provenance/hostnames", H5P_DEFAULT,
                      H5P_DEFAULT),
              0);
    H5Fclose(to);
    H5Fclose(from);
  }
  const std::string msg = error_of([&] { strata::read_run_file(path); });
  EXPECT_NE(msg.find("'/provenance/hostnames' holds 3 names for 2 ranks"), std::string::npos)
      << msg;
}

}  // namespace

// /config floats as text: the shortest that reads back, fixed notation for whole powers below 1e16
// (results/strata_results.py real_text gives the same texts).
TEST(RealText, ShortestRoundTripInFixedNotationWhereShort) {
  using strata::real_text;
  EXPECT_EQ(real_text(300), "300");
  EXPECT_EQ(real_text(3e-4), "0.0003");
  EXPECT_EQ(real_text(1e-300), "1e-300");
  EXPECT_EQ(real_text(1e16), "1e+16");
  EXPECT_EQ(real_text(1e15), "1000000000000000");
  EXPECT_EQ(real_text(123456.5), "123456.5");
  EXPECT_EQ(real_text(-2.5e7), "-25000000");
  EXPECT_EQ(real_text(0), "0");
  EXPECT_EQ(real_text(1.0 / 3), "0.3333333333333333");
}

// The timed steps' spread (/summary step_s_cv, step_s_p50_ci_low/high): the sample CV, and the
// median's order-statistic interval at the ranks of the binomial table (n 20: x(6), x(15)).
TEST(StepNoise, CoefficientOfVariationAndTheMediansInterval) {
  using strata::step_noise, strata::StepNoise;
  const StepNoise five = step_noise({5, 1, 4, 2, 3});
  EXPECT_NEAR(five.cv, std::sqrt(2.5) / 3, 1e-15);
  EXPECT_TRUE(std::isnan(five.median_low) && std::isnan(five.median_high)) << "5 steps: none";
  const StepNoise six = step_noise({6, 5, 4, 3, 2, 1});
  EXPECT_EQ(six.median_low, 1);  // P(B(6, 1/2) = 0) = 1/64 <= 2.5%
  EXPECT_EQ(six.median_high, 6);
  std::vector<double> twenty;
  for (int i = 20; i >= 1; --i) twenty.push_back(i);
  const StepNoise t = step_noise(twenty);
  EXPECT_EQ(t.median_low, 6);  // P(B(20, 1/2) <= 5) = 2.07%, <= 6: 5.77%
  EXPECT_EQ(t.median_high, 15);
  EXPECT_EQ(step_noise({2, 2, 2}).cv, 0);
  EXPECT_TRUE(std::isnan(step_noise({2}).cv));
  EXPECT_TRUE(std::isnan(step_noise({}).cv));
}

// The interval covers the true median at least 95% of the time, and not much more (it is the
// tightest the order statistics give): 4000 samples of 15 and of 61 exponential step times.
TEST(StepNoise, TheMediansIntervalCoversTheMedianAtLeast95Percent) {
  using strata::step_noise, strata::StepNoise;
  std::mt19937_64 rng(7);
  std::exponential_distribution<double> time(1.0);
  const double median = std::log(2.0);
  for (int n : {15, 61}) {
    int covered = 0;
    constexpr int kTrials = 4000;
    for (int trial = 0; trial < kTrials; ++trial) {
      std::vector<double> v(n);
      for (double& x : v) x = 1 + time(rng);
      const StepNoise noise = step_noise(v);
      covered += noise.median_low <= 1 + median && 1 + median <= noise.median_high;
    }
    const double coverage = double(covered) / kTrials;
    EXPECT_GE(coverage, 0.94) << n << " steps";  // 95% less 3 standard errors of the estimate
    EXPECT_LE(coverage, 0.99) << n << " steps";
  }
}
