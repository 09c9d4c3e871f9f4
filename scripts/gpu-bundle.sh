#!/usr/bin/env bash
# Packs a build made here for a GPU machine that has the CUDA driver, cuBLAS and NCCL but not the
# rest of strata's run-time libraries (the device tool's machines: Ubuntu, nothing to fetch), in
# under 64 MiB: the build's programs and libraries, and the Debian packages of every other shared
# library they load (Open MPI, UCX, HDF5, Boost, OpenBLAS, oneDNN, ...), as .deb files.
#
#   scripts/gpu-bundle.sh [BUILD_DIR] [OUT_DIR]        (defaults: build, .gpu)
#
# On the GPU machine, unpack the build and point scripts/gpu-check.sh at it, at the packages,
# which it unpacks under a prefix of its own (never over the machine's /) and finds through
# LD_LIBRARY_PATH and OPAL_PREFIX, and at cuDNN's libraries (cudnn.tar.xz, where the build has
# --attention cudnn). The default OUT_DIR, .gpu, is ignored by git; the device tool takes it with
# carry [".gpu"]:
#   mkdir -p /tmp/g/cudnn && tar -xf .gpu/build.tar.xz -C /tmp/g &&
#   tar -xf .gpu/cudnn.tar.xz -C /tmp/g/cudnn &&
#   STRATA_GPU_DEBS=.gpu/debs STRATA_GPU_CUDNN=/tmp/g/cudnn scripts/gpu-check.sh /tmp/g "$OUT/gpu-check.md"
set -euo pipefail
build=${1:-build}
out=${2:-.gpu}
[ -x "$build/bin/runner" ] || { echo "gpu-bundle: $build/bin/runner is not built"; exit 2; }
rm -rf "$out" && mkdir -p "$out/debs"

# The programs the GPU check runs, and every library of the build.
files=$(cd "$build" && ls -d bin/runner bin/check_run bin/bench_kernels bin/test_cuda_* \
  bin/test_nccl lib 2>/dev/null | grep -v emu || true)
tar -C "$build" -cf - $files | xz -T2 -6 >"$out/build.tar.xz"

# cuDNN, for --attention cudnn, where the build has it: the loader, the graph library and the
# runtime-compiled engines, 13 MB packed. Its flash attention engines are the runtime-compiled
# ones (NVRTC, which the GPU machine's toolkit has); test_cudnn_sdpa plans and compiles every
# graph strata makes with the precompiled engines (245 MB) and the heuristics library hidden.
cudnn=$(sed -n 's/^CUDNN_LIBRARY:FILEPATH=//p' "$build/CMakeCache.txt" 2>/dev/null)
if grep -q '^STRATA_HAVE_CUDNN:INTERNAL=ON' "$build/CMakeCache.txt" 2>/dev/null && [ -n "$cudnn" ]; then
  tar -C "$(dirname "$(readlink -f "$cudnn")")" -chf - libcudnn.so.9 libcudnn_graph.so.9 \
    libcudnn_engines_runtime_compiled.so.9 | xz -T2 -6 >"$out/cudnn.tar.xz"
fi

# Libraries the machine brings itself: the C and C++ run-times, CUDA's, NVIDIA's.
system_lib='^(ld-linux|libc|libm|libdl|librt|libresolv|libpthread|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcudnn|libnccl|libnvidia|libnvrtc|libnvJitLink)[.-]'
libs=$(find "$build/bin" "$build/lib" -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
  xargs -0 ldd 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u)
packages=$(for lib in $libs; do
  base=$(basename "$lib")
  [[ $base =~ $system_lib ]] && continue
  # By its path, else by its name (/lib and /usr/lib are one folder here; alternatives links).
  { dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "*/$base" 2>/dev/null | grep -v 'i386\|lib32'; } |
    head -1 | cut -d: -f1 || true  # the build's own: no package
done | sort -u)
# Open MPI's components and data (loaded at MPI_Init, not linked) come with its packages, and its
# orted: a singleton MPI_Init (a runner started without mpirun) forks one.
packages="$packages openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15"
(cd "$out/debs" && apt-get download $(echo "$packages" | tr ' ' '\n' | sort -u) >/dev/null)
du -sh "$out"/*.tar.xz "$out"/debs
echo "gpu-bundle: $out ($(du -sm "$out" | cut -f1) MiB; the device tool carries at most 64)"
