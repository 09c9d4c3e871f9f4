# strata quick start:
#   make run    install missing packages, configure, build, run the main job
#   make test   the same set-up, then every test (unit, CLI, multi-rank end-to-end)
BUILD ?= build
JOBS  ?= $(shell nproc)
RUNNER = $(BUILD)/bin/runner
OUT   ?= results/local
# The main job: a local scaling study (slurm/studies/local.study): every installed strategy at 1, 2
# and 4 ranks (4 = 2 virtual nodes x 2), then its tables, figures and report.html under $(OUT).
STUDY ?= slurm/studies/local.study

.PHONY: all deps configure build run test install clean

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

test: build
	cd $(BUILD) && ctest --output-on-failure -j 2

install: build
	cmake --install $(BUILD) --prefix $(or $(PREFIX),/usr/local)

clean:
	rm -rf $(BUILD) $(BUILD).configure.log
