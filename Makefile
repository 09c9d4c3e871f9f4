# strata quick start:
#   make run    install missing packages, configure, build, run the main job
#   make test   the same set-up, then every test (unit, CLI, multi-rank end-to-end, faults, Slurm
#               scripts, archive tools), the ASan + UBSan set and a bounded fuzz run
#   make fuzz   the libFuzzer targets (clang, ASan + UBSan) in build-fuzz, FUZZ_SECONDS each
#   make test-gpu  the real-GPU tests only (a machine with a GPU)
#   make package   the Debian package (CPack DEB): $(BUILD)/strata_<version>_<arch>.deb
#   make sanitize  ASan+UBSan build (build-asan/) and its tests; make tsan: TSan build (build-tsan/)
BUILD ?= build
JOBS  ?= $(shell nproc)
RUNNER = $(BUILD)/bin/runner
OUT   ?= results/local
# The main job: a local scaling study (slurm/studies/local.study): seven strategies at 1, 2 and 4
# ranks (4 = 2 virtual nodes x 2; 1 and 2 ranks repeated three times), then its tables, figures
# and report.html under $(OUT), then three held-out checks of the step-time predictor.
STUDY ?= slurm/studies/local.study
# Then the model families beside GPT-2 (slurm/studies/families.study: tiny-llama and tiny-moe under
# fsdp and 1f1b at 1, 2 and 4 ranks, run once, no profile) into $(OUT)-families.
FAMILIES_STUDY ?= slurm/studies/families.study
# Fuzzing (tests/fuzz, docs/testing.md "Fuzzing"): its own clang build with sanitizers, then run.sh.
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60

# Sanitizer builds (docs/testing.md "Sanitizers"): each configures its own build directory with
# STRATA_SANITIZE and runs the tests labelled `sanitize` there (tests/sanitize/sanitize.cmake).
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
comma := ,

.PHONY: all deps configure build run test test-gpu install package clean fuzz sanitize tsan

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release > $(BUILD).configure.log 2>&1 \
	  || { cat $(BUILD).configure.log; exit 1; }
	@grep -E '^-- strata' $(BUILD).configure.log || true

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

run: build
	$(RUNNER) --list-plugins
	rm -rf $(OUT)
	STRATA_RESULTS=$(abspath $(dir $(OUT))) STRATA_STUDY=$(notdir $(OUT)) STRATA_RUNNER=$(abspath $(RUNNER)) \
	  bash slurm/scale.sbatch $(STUDY)
	@echo "run files in $(OUT)/, summary.txt, figures and report.html in $(OUT)/figures/"
	@echo "held-out checks of the step-time predictor, a profile from each pair of ddp, zero1 and zero2"
	@echo "predicting the other strategies (scripts/heldout.sh; timings, so not fatal):"
	-@for pair in ddp,zero1 ddp,zero2 zero1,zero2; do \
	  HELDOUT_TRAIN=$$pair HELDOUT_NAME=heldout-$$(echo $$pair | tr , -) STRATA_RUNNER=$(abspath $(RUNNER)) \
	    bash scripts/heldout.sh $(OUT); done
	rm -rf $(OUT)-families
	STRATA_RESULTS=$(abspath $(dir $(OUT))) STRATA_STUDY=$(notdir $(OUT))-families STRATA_RUNNER=$(abspath $(RUNNER)) \
	  bash slurm/scale.sbatch $(FAMILIES_STUDY)
	@echo "the llama and moe families: $(OUT)-families/summary.txt and figures/report.html"

# Every test: the main build's, then the ASan + UBSan set, then a bounded fuzz run (TEST_FUZZ_SECONDS
# per target). Its dated wall times: README "Quick start" (the latest), CHANGELOG.md (each).
TEST_FUZZ_SECONDS ?= 30
# The real-GPU tests (label gpu) join where nvidia-smi sees a GPU; elsewhere the same test files
# run on the CUDA emulator (emu.*), and the gpu label is left out rather than reported skipped.
GPU_SEEN := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
test: build
	@[ "$(GPU_SEEN)" != 0 ] && [ -n "$(GPU_SEEN)" ] || \
	  echo "no GPU seen by nvidia-smi: the real-GPU tests (ctest -L gpu) are left out; their files run on the CUDA emulator as emu.*"
	cd $(BUILD) && ctest --output-on-failure -j 2 $(if $(filter-out 0,$(GPU_SEEN)),,-LE '^gpu$$')
	@$(MAKE) --no-print-directory sanitize
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(TEST_FUZZ_SECONDS)

# The real-GPU tests alone (a machine with a GPU: each must run, a skip fails).
test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L '^gpu$$'

fuzz: deps
	@cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSTRATA_BUILD_FUZZ=ON \
	  -DSTRATA_WITH_CUDA=OFF -DSTRATA_BUILD_BENCH=OFF -DSTRATA_BUILD_TESTS=OFF \
	  > $(FUZZ_BUILD).configure.log 2>&1 || { cat $(FUZZ_BUILD).configure.log; exit 1; }
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_config fuzz_run_file
	bash tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

# $(call sanitizer_tests,BUILD_DIR,SANITIZERS): configure, build, run the `sanitize` tests.
define sanitizer_tests
	@cmake -S . -B $(1) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_SANITIZE=$(2) \
	  -DSTRATA_WITH_CUDA=OFF -DSTRATA_BUILD_BENCH=OFF > $(1).configure.log 2>&1 \
	  || { cat $(1).configure.log; exit 1; }
	@grep -E '^-- strata' $(1).configure.log || true
	@cmake --build $(1) -j $(JOBS)
	cd $(1) && ctest -L sanitize --output-on-failure -j 2
endef

# ASan + UBSan: unit and CLI tests and a representative set of e2e runs (12.0 min of tests on 2 cores
# of an AMD EPYC on 2026-12-06).
sanitize: deps
	$(call sanitizer_tests,$(ASAN_BUILD),address$(comma)undefined)

# TSan: comm streams and ledger, the UCX transport on 2-3 ranks, short ddp/zero3/gpipe and failure runs,
# and the CUDA emulator's shared-memory kernels (tests/cuda_emu).
tsan: deps
	$(call sanitizer_tests,$(TSAN_BUILD),thread)

install: build
	cmake --install $(BUILD) --prefix $(or $(PREFIX),/usr/local)

# The Debian package: installs under /usr; Depends from dpkg-shlibdeps (what the binaries link).
package: build
	cd $(BUILD) && cpack -G DEB

clean:
	rm -rf $(BUILD) $(BUILD).configure.log $(FUZZ_BUILD) $(FUZZ_BUILD).configure.log \
	  $(ASAN_BUILD) $(ASAN_BUILD).configure.log $(TSAN_BUILD) $(TSAN_BUILD).configure.log
