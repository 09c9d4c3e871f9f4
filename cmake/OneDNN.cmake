# oneDNN (libdnnl-dev): bf16 GEMMs of the CPU backend (core/src/backends/cpu/gemm_bf16.cpp). Defines the
# option STRATA_WITH_ONEDNN, on when oneDNN is found, and with it the target strata::dnnl.
#
# Its CMake package first. Debian's dnnl-config.cmake (oneDNN built with the OpenCL GPU runtime)
# runs find_package(OpenCL REQUIRED), a fatal configure error where OpenCL's dev files are missing
# (ocl-icd-opencl-dev is only recommended by libdnnl-dev, and install-deps.sh installs no
# recommends), so the package is asked only when OpenCL is found; else the header and library
# directly (strata uses the CPU engine only and needs nothing of OpenCL).
find_package(OpenCL QUIET)
if(OpenCL_FOUND)
  find_package(dnnl CONFIG QUIET)
endif()
if(NOT TARGET DNNL::dnnl)
  find_path(DNNL_INCLUDE_DIR NAMES oneapi/dnnl/dnnl.hpp)
  find_library(DNNL_LIBRARY NAMES dnnl)
endif()
if(TARGET DNNL::dnnl OR (DNNL_INCLUDE_DIR AND DNNL_LIBRARY))
  set(_onednn_found ON)
else()
  set(_onednn_found OFF)
endif()
option(STRATA_WITH_ONEDNN "bf16 GEMMs on the CPU through oneDNN (libdnnl-dev)" ${_onednn_found})
if(STRATA_WITH_ONEDNN)
  if(NOT _onednn_found)
    message(FATAL_ERROR "STRATA_WITH_ONEDNN=ON but oneDNN was not found: install libdnnl-dev "
                        "(scripts/install-deps.sh) or configure with -DSTRATA_WITH_ONEDNN=OFF")
  endif()
  add_library(strata::dnnl INTERFACE IMPORTED)
  if(TARGET DNNL::dnnl)
    target_link_libraries(strata::dnnl INTERFACE DNNL::dnnl)
    message(STATUS "strata: oneDNN ${dnnl_VERSION} (CMake package)")
  else()
    target_include_directories(strata::dnnl INTERFACE ${DNNL_INCLUDE_DIR})
    target_link_libraries(strata::dnnl INTERFACE ${DNNL_LIBRARY})
    message(STATUS "strata: oneDNN ${DNNL_LIBRARY}")
  endif()
endif()
