# strata quick start:
#   make run    install missing packages, configure, build, run the main job
#   make test   the same set-up, then every test (unit, CLI, multi-rank end-to-end)
BUILD ?= build
JOBS  ?= $(shell nproc)
RUNNER = $(BUILD)/bin/runner
OUT   ?= results/local
# The main job: ddp, dp, tp (dp2 x tp2) and 1f1b (dp2 x pp2) on 4 local ranks (2 virtual nodes x 2),
# tiny model.
RUN_ARGS ?= --nodes 2 --ranks-per-node 2 --model tiny --steps 30 --out $(OUT)

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
	$(RUNNER) --plugin ddp $(RUN_ARGS)
	$(RUNNER) --plugin dp $(RUN_ARGS)
	$(RUNNER) --plugin tp --mesh dp=2,tp=2 --plugin-opt sp=on $(RUN_ARGS)
	$(RUNNER) --plugin 1f1b --mesh dp=2,pp=2 --micro-batch 2 --global-batch 16 $(RUN_ARGS)
	results/plot $(OUT)
	@echo "run files in $(OUT)/, figures and report.html in $(OUT)/figures/"

test: build
	cd $(BUILD) && ctest --output-on-failure -j 2

install: build
	cmake --install $(BUILD) --prefix $(or $(PREFIX),/usr/local)

clean:
	rm -rf $(BUILD) $(BUILD).configure.log
