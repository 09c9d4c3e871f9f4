// Small formatting helpers for what the runner prints.
#pragma once
#include <cstdio>
#include <string>

#include "strata/mesh.hpp"

namespace strata {

// "dp=4 tp=1 pp=1", with " ep=2" where experts are split and " cp=2" where sequences are.
inline std::string mesh_text(const MeshSpec& m) {
  std::string s =
      "dp=" + std::to_string(m.dp) + " tp=" + std::to_string(m.tp) + " pp=" + std::to_string(m.pp);
  if (m.ep > 1) s += " ep=" + std::to_string(m.ep);
  return m.cp > 1 ? s + " cp=" + std::to_string(m.cp) : s;
}

// 1536 -> "1.50 KiB"
inline std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", b, units[u]);
  return buf;
}

// A message as one line: library errors (HDF5's among them) may carry newlines, and every error
// strata prints or records is one line.
inline std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace strata
