// Backend libraries (backend.hpp: declare_backend_library): declared without loading, loaded once
// by the first call that needs the device or a transport of theirs, and a library that does not
// load answers with why, not a crash. Each case in a process of its own (gtest death tests): the
// registries are the process's.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backends/backend.hpp"
#include "comm/transport.hpp"

namespace strata {
namespace {

bool loaded(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (h) dlclose(h);  // drops only the reference RTLD_NOLOAD took
  return h != nullptr;
}

int times_listed(const std::string& transport) {
  const std::vector<std::string> all = transports_built();
  return static_cast<int>(std::count(all.begin(), all.end(), transport));
}

#define CHECK_OR_EXIT(cond)                                            \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::fprintf(stderr, "failed: %s (line %d)\n", #cond, __LINE__); \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)

void declared_then_loaded_on_first_use() {
  declare_backend_library(Device::cuda, STRATA_FAKE_BACKEND, {"fakecomm"});
  CHECK_OR_EXIT(!loaded(STRATA_FAKE_BACKEND));  // declaring loads nothing
  CHECK_OR_EXIT(backend_built(Device::cuda));
  CHECK_OR_EXIT(times_listed("fakecomm") == 1);
  CHECK_OR_EXIT(!loaded(STRATA_FAKE_BACKEND));
  // The first question about the device loads it; its factory answers.
  CHECK_OR_EXIT(backend_unavailable(Device::cuda, BackendRequest{0, 3}) ==
                "fake backend: asked for 3 rank(s)");
  CHECK_OR_EXIT(loaded(STRATA_FAKE_BACKEND));
  CHECK_OR_EXIT(times_listed("fakecomm") == 1);  // now by its own registration, once
  CHECK_OR_EXIT(transport_version("fakecomm") == "fakecomm 1.0");
  std::exit(0);
}

void transport_loads_it_too() {
  declare_backend_library(Device::cuda, STRATA_FAKE_BACKEND, {"fakecomm"});
  CHECK_OR_EXIT(transport_version("fakecomm") == "fakecomm 1.0");
  CHECK_OR_EXIT(loaded(STRATA_FAKE_BACKEND));
  std::exit(0);
}

void missing_library_says_why() {
  declare_backend_library(Device::cuda, "/nonexistent/libstrata_nothing.so", {"nowhere"});
  CHECK_OR_EXIT(backend_built(Device::cuda));
  const std::string why = backend_unavailable(Device::cuda, BackendRequest{});
  CHECK_OR_EXIT(why.find("cannot load /nonexistent/libstrata_nothing.so") == 0);
  CHECK_OR_EXIT(times_listed("nowhere") == 1);  // still a choice, whose use says why it fails
  CHECK_OR_EXIT(transport_version("nowhere") == why);
  bool threw = false;
  try {
    split_group("nowhere", "dp", 0, 0, nullptr);
  } catch (const Error& e) {
    threw = std::string(e.what()).find("cannot load") != std::string::npos;
  }
  CHECK_OR_EXIT(threw);
  std::exit(0);
}

TEST(BackendLibrary, DeclaredThenLoadedOnFirstUse) {
  EXPECT_EXIT(declared_then_loaded_on_first_use(), testing::ExitedWithCode(0), "");
}

TEST(BackendLibrary, ATransportOfItsLoadsItToo) {
  EXPECT_EXIT(transport_loads_it_too(), testing::ExitedWithCode(0), "");
}

TEST(BackendLibrary, MissingLibrarySaysWhy) {
  EXPECT_EXIT(missing_library_says_why(), testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace strata
