// The unit tests' random inputs: floats uniform in a range and tokens, from a seed (the CPU layer
// tests and the CUDA tests draw the same values).
#pragma once
#include <cstdint>
#include <random>
#include <vector>

// n floats uniform in [lo, hi) from a seed, and n tokens in [0, V): the tests' inputs.
inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
inline std::vector<std::int32_t> random_tokens(std::size_t n, int V, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, V - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
