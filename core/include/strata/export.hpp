// strata SDK: what libstrata_core exports. The library is built with hidden visibility, so only
// declarations between STRATA_EXPORT_BEGIN and STRATA_EXPORT_END are visible outside it: every SDK
// header's (what a plugin links against), and those of the core's internal headers that the
// runner's own library, the CUDA backend library and the tests call. Everything else stays inside
// the library, where it cannot clash with a plugin's symbols or be bound to by one.
#pragma once

#define STRATA_EXPORT_BEGIN _Pragma("GCC visibility push(default)")
#define STRATA_EXPORT_END _Pragma("GCC visibility pop")
