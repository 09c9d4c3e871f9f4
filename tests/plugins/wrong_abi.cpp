// Test-only: a library that looks like a plugin but declares another ABI version. The loader must
// refuse it before touching its descriptor (whose layout it cannot trust).
#include <boost/dll/alias.hpp>
#include <cstdint>

namespace wrong_abi {
const std::uint32_t version = 999;
int descriptor_placeholder = 0;
int create_placeholder = 0;
BOOST_DLL_ALIAS(wrong_abi::version, strata_abi_version)
BOOST_DLL_ALIAS(wrong_abi::descriptor_placeholder, strata_descriptor)
BOOST_DLL_ALIAS(wrong_abi::create_placeholder, strata_create)
}  // namespace wrong_abi
