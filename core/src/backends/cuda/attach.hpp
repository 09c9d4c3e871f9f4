// The CUDA backend's entry point (attach.cpp): what the core calls when it loads libstrata_cuda.so
// (backend.hpp: declare_backend_library) and what a runner linked with the backend calls at start.
#pragma once

extern "C" void strata_attach_backend();
