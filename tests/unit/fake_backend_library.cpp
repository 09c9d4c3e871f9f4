// A stand-in backend library for test_backend_library: what libstrata_cuda.so's entry point does
// (register a backend and a transport), with a backend that is never available and a transport
// that only reports its version.
#include "backends/backend.hpp"
#include "comm/transport.hpp"

extern "C" __attribute__((visibility("default"))) void strata_attach_backend() {
  strata::BackendFactory f;
  f.unavailable = [](const strata::BackendRequest& r) {
    return "fake backend: asked for " + std::to_string(r.local_size) + " rank(s)";
  };
  f.open = [](const strata::BackendRequest&) -> std::unique_ptr<strata::DeviceBackend> {
    return nullptr;
  };
  strata::register_backend(strata::Device::cuda, f);
  strata::register_transport(
      strata::TransportEntry{"fakecomm", nullptr, [] { return std::string("fakecomm 1.0"); }});
}
