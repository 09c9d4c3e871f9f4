// /provenance: the core's entries, and what a registered provider (the CUDA backend's) adds or
// replaces.
#include <gtest/gtest.h>

#include <string>

#include "provenance/provenance.hpp"

namespace {

std::string value(const strata::Provenance& p, const std::string& key, int* count = nullptr) {
  std::string v = "(absent)";
  int n = 0;
  for (const auto& [k, val] : p)
    if (k == key) v = val, ++n;
  if (count) *count = n;
  return v;
}

// A provider stays registered for the process's life, so this one answers only while its test
// turns it on: the other tests, and this one run again (--gtest_repeat), start without its keys.
bool g_provider_on = false;
strata::Provenance test_provider() {
  if (!g_provider_on) return {};
  return {{"cuda_version", "99.9"}, {"test_only_key", "yes"}};
}

TEST(Provenance, OneDnnVersionAndImplementation) {
  const auto p = strata::collect_provenance();
  EXPECT_NE(value(p, "onednn_version"), "(absent)");
  EXPECT_FALSE(value(p, "onednn_version").empty());
  EXPECT_NE(value(p, "onednn_bf16_gemm_impl"), "(absent)");  // empty where no bf16 matmul
}

TEST(Provenance, ProviderReplacesAndAdds) {
  EXPECT_EQ(value(strata::collect_provenance(), "test_only_key"), "(absent)");
  strata::register_provenance_provider(&test_provider);
  strata::register_provenance_provider(&test_provider);  // twice: still one entry each
  g_provider_on = true;
  const auto p = strata::collect_provenance();
  g_provider_on = false;
  int n = 0;
  EXPECT_EQ(value(p, "cuda_version", &n), "99.9");  // replaces the core's "not built"
  EXPECT_EQ(n, 1);
  EXPECT_EQ(value(p, "test_only_key", &n), "yes");
  EXPECT_EQ(n, 1);
}

}  // namespace
