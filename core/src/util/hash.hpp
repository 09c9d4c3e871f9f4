// Counter-based hashing: deterministic values from (seed, counters), independent of who asks.
#pragma once
#include <cstdint>

namespace strata {

inline std::uint64_t mix64(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline std::uint64_t hash4(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  return mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ d);
}

}  // namespace strata
