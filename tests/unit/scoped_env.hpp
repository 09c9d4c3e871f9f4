// An environment variable set (or, with nullptr, unset) for one scope, and put back as it was
// after it: for tests that steer a library through its environment.
#pragma once
#include <cstdlib>
#include <string>

struct ScopedEnv {
  std::string name, saved;
  bool had;
  ScopedEnv(const char* n, const char* value) : name(n) {
    const char* old = std::getenv(n);
    had = old != nullptr;
    if (had) saved = old;
    if (value)
      ::setenv(n, value, 1);
    else
      ::unsetenv(n);
  }
  ~ScopedEnv() {
    if (had)
      ::setenv(name.c_str(), saved.c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};
