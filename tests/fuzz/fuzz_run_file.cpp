// fuzz_run_file: structure-aware libFuzzer target for the run file reader, read_run_file
// (core/src/results/hdf5_reader.cpp).
// Contract: read_run_file returns a RunRecord whose matrices have the shapes run_record.hpp states,
// or throws strata::Error; it leaves no HDF5 object open. Anything else (another exception, a
// crash, a leak, a sanitizer report, an out-of-memory) is a bug.
//
// Flipping bytes of an HDF5 file mostly finds bugs inside libhdf5, which we cannot fix. What is
// ours is how the reader handles valid HDF5 with the wrong structure, so the input is a program of
// edits (run_file_edits.hpp) made with the HDF5 C API to a valid run file written once by
// write_run_file: objects deleted, groups and datasets swapped, attributes and datasets rewritten
// with other types, shapes and values, links and junk added. Then the reader reads the edited file.
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <typeinfo>

#include "results/hdf5_util.hpp"
#include "results/run_record.hpp"
#include "run_file_edits.hpp"
#include "strata/types.hpp"

namespace {

namespace fs = std::filesystem;
using strata::RunRecord;

// A small run with every part of the schema: 2 ranks x 3 steps, a comm op, trace and calibration
// tables, memory and summary.
RunRecord base_record() {
  RunRecord r;
  r.run_id = "fuzz";
  r.created_utc = "2026-01-01T00:00:00Z";
  r.command_line = "runner --plugin ddp";
  r.config = {{"plugin", "ddp"}, {"steps", "3"}, {"model", "tiny"}};
  r.provenance = {{"compiler", "clang"}, {"mpi_version", "4.1"}};
  r.hostnames = {"node-a", "node-b"};
  r.ranks = 2;
  r.steps = 3;
  r.step_metrics = {"step_s", "loss"};
  r.step_units = {{"step_s", "s"}, {"loss", "1"}};
  r.step_values = {{"step_s", {1, 2, 3, 4, 5, 6}}, {"loss", {6, 5, 4, 6, 5, 4}}};
  const std::vector<double> m = {1, 2, 3, 4, 5, 6};
  r.comm["all_reduce"] = {m, m, m, 4.5e6, m, m, {7, 8}};
  r.trace = {{0, "compute", "forward", "forward", 0, 1, 0},
             {1, "comm0", "all_reduce", "dp", 1, 2, 64},
             {1, "compute", "backward", "backward", 2, 3, 0}};
  r.calibration = {{"dp", "all_reduce", 2, 65536, 1e-4, 6.5e8, 6.5e8},
                   {"dp", "all_gather", 2, 65536, 2e-4, 3.2e8, 1.6e8}};
  r.memory_tags = {"params", "grads"};
  r.peak_bytes = {1, 2, 3, 4};
  r.predicted_bytes = {5, 6};
  r.predicted_bytes_per_rank = {1, 2, 3, 4};
  r.process_peak_bytes = {9, 10};
  r.summary = {{"tokens_per_s", 123.5, "tokens/s"}, {"mfu", 0.25, "1"}};
  return r;
}

[[noreturn]] void contract_broken(const std::string& what) {
  std::fprintf(stderr, "fuzz_run_file: %s\n", what.c_str());
  std::abort();
}

// The shapes run_record.hpp promises: what the check tools index by.
void check_shapes(const RunRecord& r) {
  if (r.ranks < 0 || r.steps < 0) contract_broken("negative ranks or steps");
  const std::size_t cells = std::size_t(r.ranks) * std::size_t(r.steps);
  const std::size_t tags = r.memory_tags.size(), ranks = std::size_t(r.ranks);
  for (const auto& m : r.step_metrics)
    if (!r.step_values.count(m) || r.step_values.at(m).size() != cells || !r.step_units.count(m))
      contract_broken("/steps/" + m + " is not [ranks x steps] with a unit");
  for (const auto& [op, c] : r.comm)
    for (const auto* v : {&c.calls, &c.bytes, &c.time_s, &c.algbw, &c.busbw})
      if (v->size() != cells) contract_broken("/comm/" + op + " is not [ranks x steps]");
  auto rows_of = [&](std::size_t size, std::size_t row) { return size == 0 || size == row; };
  for (const auto& [op, c] : r.comm)
    if (!rows_of(c.predicted_bytes_per_rank.size(), ranks))
      contract_broken("/comm/" + op + "/predicted_bytes_per_rank is not [ranks]");
  if (!rows_of(r.hostnames.size(), ranks)) contract_broken("hostnames are not [ranks]");
  if (!rows_of(r.peak_bytes.size(), ranks * tags) ||
      !rows_of(r.predicted_bytes_per_rank.size(), ranks * tags) ||
      !rows_of(r.predicted_bytes.size(), tags) || !rows_of(r.process_peak_bytes.size(), ranks))
    contract_broken("/memory datasets are not [ranks x tags], [tags] and [ranks]");
}

fs::path work_dir, run_file;
std::string base_bytes;
fuzz::Targets targets;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::string templ = (fs::temp_directory_path() / "strata-fuzz-run-file-XXXXXX").string();
  if (!::mkdtemp(templ.data())) {
    std::perror("fuzz_run_file: mkdtemp");
    std::exit(1);
  }
  work_dir = templ;  // external links the edits add resolve here, beside the run file
  run_file = work_dir / "run.h5";
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // failed edits are expected: no error stacks
  strata::write_run_file(base_record(), run_file.string());
  std::ifstream f(run_file, std::ios::binary);
  base_bytes.assign(std::istreambuf_iterator<char>(f), {});
  targets = fuzz::list_targets(run_file.string());
  std::atexit([] {
    std::error_code ignored;
    fs::remove_all(work_dir, ignored);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::ofstream(run_file, std::ios::binary | std::ios::trunc) << base_bytes;
  FuzzedDataProvider input(data, size);
  fuzz::edit_run_file(run_file.string(), targets, input);
  try {
    check_shapes(strata::read_run_file(run_file.string()));
  } catch (const strata::Error& e) {
    if (std::getenv("FUZZ_VERBOSE")) std::fprintf(stderr, "read_run_file: %s\n", e.what());
  } catch (const std::exception& e) {
    contract_broken(std::string("read_run_file threw ") + typeid(e).name() +
                    ", not strata::Error: " + e.what());
  }
  if (const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL); open != 0)
    contract_broken(std::to_string(open) + " HDF5 objects left open after read_run_file");
  return 0;
}
