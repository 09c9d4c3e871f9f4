// Edits of an HDF5 file driven by fuzz input, for fuzz_run_file: each edit keeps the file valid
// HDF5 but breaks the run file schema in one way (an object deleted or of the other kind, an
// attribute or a dataset of another type, shape or value, a new link, junk). Edits that HDF5
// refuses (e.g. on an object an earlier edit deleted) are skipped.
#pragma once
#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <utility>
#include <vector>

namespace fuzz {

// What the edits aim at: the objects and attributes of the unedited file, and names to create.
struct Targets {
  std::vector<std::string> objects;                        // "/", "/steps", "/steps/loss", ...
  std::vector<std::pair<std::string, std::string>> attrs;  // (object path, attribute name)
  std::vector<std::string> names;                          // link and attribute names seen
};

Targets list_targets(const std::string& path);

// Opens `path` read-write, applies the edits `input` describes, closes it.
void edit_run_file(const std::string& path, const Targets& targets, FuzzedDataProvider& input);

}  // namespace fuzz
