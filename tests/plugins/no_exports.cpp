// Test-only: a valid shared library that is not a strata plugin.
extern "C" int strata_test_not_a_plugin() { return 42; }
