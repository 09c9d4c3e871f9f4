#!/usr/bin/env bash
# The Debian package (`make package`: cpack -G DEB) unpacked with dpkg-deb into a temporary root,
# used from there as a user would:
#   0. results/ holds the archive tools and no study (make run writes results/local in a checkout);
#   1. its Depends name exactly the packages of the libraries its ELF files link (objdump NEEDED,
#      resolved by ldd, owner by dpkg -S): none missing, none extra (a library under /usr/local or
#      /opt that no package owns, such as NVIDIA's CUDA toolkit, is listed, not declarable);
#   2. the out-of-tree plugin (tests/out_of_tree) builds against it with find_package(strata) +
#      strata_add_plugin() (CMAKE_PREFIX_PATH=<root>/usr), and again with pkg-config (strata.pc);
#   3. the unpacked slurm/scale.sbatch runs a short study of ddp and that plugin
#      (STRATA_PLUGIN_PATH) on 1 and 2 ranks with the unpacked runner, plugins and results/ tools;
#      the plugin follows ddp's losses, and every run file's /provenance has the package version.
# usage: deb.sh SOURCE_DIR BUILD_DIR WORK_DIR CHECK_RUN
set -euo pipefail
src=$1 build=$(cd "$2" && pwd) work=$3 check_run=$4
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
version=$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")$/\1/p' "$build/CPackConfig.cmake")
[[ -n $version ]] || fail "no CPACK_PACKAGE_VERSION in $build/CPackConfig.cmake"

cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/cpack" > "$work/cpack.log" 2>&1 \
  || { cat "$work/cpack.log"; fail "cpack -G DEB"; }
deb=$(ls "$work"/cpack/strata_"$version"_*.deb) || fail "no strata_${version}_*.deb in $work/cpack"
root=$work/root
dpkg-deb -x "$deb" "$root"
echo "package $(basename "$deb"): $(find "$root" -type f | wc -l) files"
# results/ ships its tools, never a study: make run writes results/local into the checkout.
shipped=$root/usr/share/strata/results
while IFS= read -r tool; do
  [[ -f $shipped/$tool ]] || fail "results/$tool is not in the package"
done < <(find "$src/results" -maxdepth 1 -type f \( -perm -u+x -o -name '*.py' \) -printf '%f\n')
studies=$(find "$shipped" -mindepth 1 -maxdepth 1 -type d ! -name web -printf '%f ')
[[ -z $studies ]] || fail "the package ships directories of results/ that are studies: $studies"

# 1. Depends = the packages of what the binaries link. Every library path is resolved first and
# dpkg asked once (one `dpkg -S` reads the whole file database: 0.2 s a call, 26 of this test's
# 104 s when it was asked per library).
declared=$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed -E 's/\(.*\)//; s/[[:space:]]//g' | sort -u | grep . || true)
declare -A linked  # library path -> the first ELF file that links it
elfs=0
while IFS= read -r f; do
  [[ $(head -c 4 "$f" | tr -d '\0') == $'\x7fELF' ]] || continue
  elfs=$((elfs + 1))
  resolved=$(ldd "$f") || fail "ldd $f"
  for lib in $(objdump -p "$f" | awk '$1 == "NEEDED" {print $2}'); do
    # "libx.so.1 => /path (addr)", or for the dynamic loader "/lib64/ld-linux-x86-64.so.2 (addr)"
    path=$(awk -v l="$lib" '$1 == l && $2 == "=>" {print $3} $1 ~ "/" l "$" {print $1}' <<<"$resolved")
    [[ -n $path && $path != "not" ]] || fail "$f: $lib not found (ldd)"
    [[ $path == "$root"/* ]] && continue  # the package's own library
    [[ -n ${linked[$path]:-} ]] || linked[$path]=$f
  done
done < <(find "$root/usr/bin" "$root/usr/lib" -type f)
((elfs >= 9)) || fail "only $elfs ELF files in the package (runner, 2 libraries, 7 plugins expected)"
# Each path as ldd names it, and with /usr added or removed (merged /usr: /lib is /usr/lib).
queries=()
for path in "${!linked[@]}"; do queries+=("$path" "/usr$path" "${path#/usr}"); done
declare -A owner_of  # path -> its package ("pkg:arch, other: /path": the first one, no arch)
while IFS= read -r line; do
  [[ $line == *": /"* ]] || continue
  owners=${line%%: /*}
  owners=${owners%%,*}
  owner_of[/${line#*: /}]=${owners%%:*}
done < <(dpkg -S "${queries[@]}" 2>/dev/null || true)
needed_pkgs=() unowned=()
for path in "${!linked[@]}"; do
  owner=${owner_of[$path]:-${owner_of[/usr$path]:-${owner_of[${path#/usr}]:-}}}
  if [[ -z $owner ]]; then
    # A toolkit installed outside apt (NVIDIA's CUDA in /usr/local/cuda) has no package to
    # declare; a library in the system's own directories must have one.
    [[ $path == /usr/local/* || $path == /opt/* ]] || fail "${linked[$path]}: $path belongs to no Debian package"
    unowned+=("$path")
    continue
  fi
  needed_pkgs+=("$owner")
done
needed=$(printf '%s\n' "${needed_pkgs[@]}" | sort -u)
# A library's owner P is covered by a declared D = P, or by a D that depends on P as one of a group
# of alternatives (libopenblas0: libopenblas0-pthread | -openmp | -serial, the implementations its
# shlibs file leaves to the user); a D that merely depends on P (hdf5-tools on libhdf5) is extra.
declare -A alternatives  # declared D -> the packages of its Depends' groups of alternatives
for d in $declared; do
  alternatives[$d]=" $(dpkg-query -W -f='${Depends}' "$d" 2>/dev/null | tr ',' '\n' | grep '|' \
    | tr '|' '\n' | sed -E 's/\(.*\)//; s/:any//; s/[[:space:]]//g' | tr '\n' ' ' || true)"
done
declare -A used
missing=""
for p in $needed; do
  hit=""
  for d in $declared; do
    if [[ $d == "$p" || ${alternatives[$d]} == *" $p "* ]]; then
      hit=$d used[$d]=1
    fi
  done
  [[ -n $hit ]] || missing+=" $p"
done
extra=""
for d in $declared; do [[ -n ${used[$d]:-} ]] || extra+=" $d"; done
[[ -z $missing ]] || fail "Depends lacks$missing (linked by the binaries); Depends: $(echo $declared)"
[[ -z $extra ]] || fail "Depends names$extra, which no binary links; linked: $(echo $needed)"
((${#unowned[@]} == 0)) || echo "linked from outside Debian's packages (nothing to declare): ${unowned[*]}"
echo "Depends = the $(wc -l <<<"$needed") packages the $elfs ELF files link: $(echo $needed)"

# The unpacked tree holds no path of the build, and the runner uses its own libraries and plugins.
stale=$(grep -rlF -e "$build" -e "$(cd "$src" && pwd)" "$root/usr/lib/cmake" "$root/usr/lib/pkgconfig" || true)
[[ -z $stale ]] || fail "build paths in $stale"
runner=$root/usr/bin/runner
ldd "$runner" | grep -E "libstrata_core.so.[0-9.]+ => $root/usr/(bin/../)?lib/" >/dev/null || fail "runner does not load $root's libstrata_core"
[[ $("$runner" --version) == "runner: strata $version "* ]] || fail "runner --version: $("$runner" --version)"
"$runner" --describe ddp | grep "plugin  $root/usr/lib/strata/plugins/libstrata_ddp.so" >/dev/null \
  || fail "the unpacked runner loads plugins from outside $root"
# The CUDA backend's library: installed beside the plugins, loaded only when a run needs it (the
# runner links no CUDA library), from the unpacked tree.
if [[ -f $build/lib/strata/libstrata_cuda.so ]]; then
  [[ -f $root/usr/lib/strata/libstrata_cuda.so ]] || fail "no usr/lib/strata/libstrata_cuda.so"
  ! ldd "$runner" | grep -E 'libcu(blas|dart)' >/dev/null || fail "runner links CUDA libraries"
  "$runner" --list-transports | grep -P '^nccl\tNCCL [0-9]' >/dev/null \
    || fail "runner --list-transports: nccl's version not from $root's libstrata_cuda.so"
fi

# 2. The out-of-tree plugin against the unpacked package: CMake, then pkg-config.
plugin=$work/plugin
mkdir -p "$plugin/cmake" "$plugin/pc"
cp "$src/tests/out_of_tree/CMakeLists.txt" "$src/tests/out_of_tree/zero_lean.cpp" "$plugin/"
cmake -S "$plugin" -B "$plugin/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$root/usr" \
  > "$work/plugin-configure.log" 2>&1 || { cat "$work/plugin-configure.log"; fail "configure against $root/usr"; }
grep -q "^strata_DIR:PATH=$root/usr/lib/cmake/strata$" "$plugin/cmake/CMakeCache.txt" || fail "strata_DIR not in $root"
cmake --build "$plugin/cmake" > "$work/plugin-build.log" 2>&1 || { cat "$work/plugin-build.log"; fail "plugin build"; }
export PKG_CONFIG_PATH=$root/usr/lib/pkgconfig
# shellcheck disable=SC2046
g++ -shared -O2 -o "$plugin/pc/libstrata_zero_lean.so" "$plugin/zero_lean.cpp" $(pkg-config --cflags --libs strata) \
  || fail "plugin build with pkg-config --cflags --libs strata"
[[ $(pkg-config --modversion strata) == "$version" ]] || fail "strata.pc version $(pkg-config --modversion strata)"
for dir in "$plugin/cmake" "$plugin/pc"; do
  "$runner" --plugin-path "$dir" --list-plugins 2>&1 | grep -E "^zero-lean +" >/dev/null || fail "zero-lean from $dir not listed"
done

# 3. A short study from the unpacked tree: its scale.sbatch, results/ tools and (default) runner.
cat > "$work/pkg.study" <<'EOF'
STRATA_STUDY=pkg
STRATA_STRATEGIES=ddp,zero-lean
STRATA_NODES=1x1,1x2
STRATA_MODEL=tiny
STRATA_STEPS=4
STRATA_MODE=strong
STRATA_GLOBAL_BATCH=8
STRATA_RUNNER_ARGS=--blas-threads 1 --warmup 1 --peak-tflops 1
EOF
(cd "$work" && STRATA_PLUGIN_PATH=$plugin/cmake bash "$root/usr/share/strata/slurm/scale.sbatch" pkg.study) \
  > "$work/study.log" 2>&1 || { cat "$work/study.log"; fail "study from $root"; }
study=$work/results/pkg
for s in ddp zero-lean; do
  for n in 1 2; do
    run=tiny_${s}_n1x${n}_strong_r1
    [[ -f $study/$run.ok ]] || { cat "$work/study.log"; fail "$run did not finish"; }
    "$check_run" layout "$study/$run.h5" "$n" 4 >/dev/null || fail "$run.h5 layout"
    prov=$(h5dump -a /provenance/strata_version "$study/$run.h5" | sed -n 's/.*(0): "\(.*\)".*/\1/p')
    [[ $prov == "$version" ]] || fail "$run.h5 /provenance strata_version '$prov', package $version"
  done
  "$check_run" trajectory "$study/tiny_ddp_n1x2_strong_r1.h5" "$study/tiny_${s}_n1x2_strong_r1.h5" 1e-5 >/dev/null \
    || fail "$s left ddp's trajectory"
done
# The table ends at the first blank line (the provenance and caveats block follows).
[[ $(sed '/^$/q' "$study/summary.txt" | grep -c .) -eq 5 ]] || { cat "$study/summary.txt"; fail "summary.txt: a header and 4 rows expected"; }
[[ $(grep -c "launch: $runner " "$work/study.log") -eq 4 ]] || fail "the study's runs did not all use $runner"
[[ -s $study/figures/report.html ]] || fail "no report.html: the unpacked results/plot did not run"
echo "study of ddp and zero-lean on 1 and 2 ranks from $root: 4 runs, strata_version $version in each"
