#!/usr/bin/env bash
# Install the Debian/Ubuntu packages strata needs, only those missing. Idempotent; non-interactive.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git
  libopenmpi-dev openmpi-bin            # MPI transport and launcher
  libucx-dev                            # UCX transport (--transport ucx)
  libgloo-dev                           # gloo transport (--transport gloo)
  libhdf5-dev hdf5-tools                # run files
  libhwloc-dev                          # node topology in each run file's /provenance
  libboost-dev libboost-program-options-dev libboost-filesystem-dev  # CLI, Boost.DLL
  libopenblas-dev                       # CBLAS for the CPU backend
  libdnnl-dev                           # oneDNN: bf16 GEMMs for --precision bf16 on the CPU
  libgtest-dev libbenchmark-dev         # tests and micro-benchmarks
  clang libclang-rt-14-dev libomp-dev   # make fuzz: libFuzzer + sanitizer runtimes, clang's OpenMP
  python3-h5py python3-numpy python3-matplotlib  # results/ tools (Debian's /usr/bin/python3)
  python3-pandas                        # tests/results/export.py reads results/export with pandas
  chromium                              # tests/results/report_html.py opens report.html headless
  file                                  # tests check figure file types; CPack DEB with shlibdeps
  dpkg-dev                              # make package: dpkg-shlibdeps derives the package's Depends
  slurmctld slurmd slurm-client munge libpmix-dev  # slurm/local-cluster, srun --mpi=pmix
)
# npm: the build installs report.html's charting libraries with it (cmake/ReportWeb.cmake). A
# machine with Node.js from elsewhere has npm with it; Debian's packages otherwise.
command -v npm >/dev/null || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
