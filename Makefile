# Ember — the two set-up commands on a fresh Debian 12 machine are
#   make demo    (installs what is missing, builds, trains a small LM on Debian's fortunes, samples it)
#   make test    (installs what is missing, builds, runs every CPU test)
# Other targets: deps build install test-asan test-gpu test-gpu-memcheck test-dist-gpu
#   test-parity bench bench-compare clean.
# Variables: BUILD (build dir), CUDA=ON|OFF|auto, PREFIX (install prefix).

BUILD  ?= build
CUDA   ?= auto
PREFIX ?= /usr/local
JOBS   ?= $(shell nproc)

DEB_PACKAGES = build-essential cmake ninja-build pkg-config lua5.4 liblua5.4-dev \
  lua-cjson lua-busted lua-argparse libopenblas-dev libopenmpi-dev openmpi-bin libreadline-dev \
  libpcre2-dev fortunes

ifeq ($(CUDA),auto)
CUDA_FLAG =
else
CUDA_FLAG = -DEMBER_CUDA=$(CUDA)
endif

SUDO = $(shell [ "$$(id -u)" = 0 ] || echo sudo)

BUSTED ?= $(shell command -v busted || echo /usr/bin/busted)
MODELS ?= small

.PHONY: all deps build demo test test-asan test-gpu test-gpu-memcheck test-parity test-dist-gpu install bench \
  bench-compare clean

all: build

# A machine without network (the GPU host) brings Lua, busted and OpenBLAS in
# .deps (shared/offline-deps) and sources /opt/deps/env.sh, which sets
# LUA_INCLUDE_DIR: then nothing is installed here.
deps:
	@if [ -n "$$LUA_INCLUDE_DIR" ]; then echo "deps: using the environment's Lua and BLAS (LUA_INCLUDE_DIR=$$LUA_INCLUDE_DIR)"; exit 0; fi; \
	missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CUDA_FLAG) -DCMAKE_INSTALL_PREFIX=$(PREFIX)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# DEMO_FLAGS: e.g. --device cpu, --steps 100, --fresh (see ember run examples/demo.lua --help)
demo: build
	$(BUILD)/ember run examples/demo.lua $(DEMO_FLAGS)

test: build
	EMBER_BUILD=$(BUILD) bash tests/run_all.sh

# AddressSanitizer + UBSan over the C tests and the Lua specs (run through the
# instrumented ember executable, so no LD_PRELOAD is needed). The distributed
# specs run too: Open MPI's own once-per-process allocations are suppressed by
# library (tests/lsan_mpi.supp), which needs exact unwinding (MPI has no frame
# pointers) and its plugins kept loaded.
test-asan: deps
	cmake -S . -B build-asan -G Ninja -DEMBER_CUDA=OFF -DEMBER_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
	cmake --build build-asan -j $(JOBS)
	EMBER_BUILD=build-asan EMBER_LUA_RUNNER=ember \
	  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:fast_unwind_on_malloc=0 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan_mpi.supp OMPI_MCA_mca_base_component_disable_dlclose=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 bash tests/run_all.sh

# GPU specs (tests/gpu: every op on CUDA against the CPU, autocast, the LM on
# CUDA vs CPU, graphs, OOM). Run through the ember executable, which puts its
# own package dir first (a stock lua5.4 would need LUA_PATH_5_4 set).
test-gpu: build
	EMBER_BUILD=$(BUILD) EMBER_TEST_GPU=1 EMBER_LUA_RUNNER=ember bash tests/run_all.sh

# The GPU op suite under compute-sanitizer's memcheck: any out-of-bounds or
# misaligned device access, or a failing CUDA call, fails the run. The two specs
# that exhaust device memory on purpose (OOM handling) are left out: their
# deliberate cudaMalloc failures would be reported as API errors. The profiler
# spec is left out too: it needs CUPTI, which serves one client per process;
# and the studies spec, which runs the study scripts as child processes (their
# kernels are the ops the other specs cover). The flash specs' checks by kernel
# name need CUPTI too: EMBER_UNDER_SANITIZER=1 makes them pending (reported
# skipped, with the reason) instead of failing.
MEMCHECK_SPECS = $(filter-out tests/gpu/device_spec.lua tests/gpu/lm_spec.lua tests/gpu/profiler_spec.lua \
  tests/gpu/studies_spec.lua,\
  $(wildcard tests/gpu/*_spec.lua))
test-gpu-memcheck: build
	EMBER_BUILD=$(BUILD) EMBER_UNDER_SANITIZER=1 compute-sanitizer --tool memcheck --error-exitcode 1 $(BUILD)/ember run $(BUSTED) $(MEMCHECK_SPECS)

# The distributed specs (tests/dist) on CUDA tensors over NCCL, one rank per
# GPU (run on a host with 2 or more GPUs; EMBER_DIST_NPROCS overrides).
NGPUS ?= $(shell nvidia-smi -L 2>/dev/null | wc -l)
test-dist-gpu: build
	EMBER_BUILD=$(BUILD) EMBER_TEST_DIST=1 EMBER_DIST_DEVICE=cuda EMBER_DIST_NPROCS="$(NGPUS)" bash tests/run_all.sh

# PyTorch parity of the TransformerLM (logits, loss, every gradient; f32 and
# bf16 autocast; CPU, and CUDA when present). Needs python3 with torch.
test-parity: build
	EMBER_BUILD=$(BUILD) bash tests/reference/run.sh

# Ember vs PyTorch (eager, compile; sdpa) on $(MODELS), one Markdown table.
bench-compare: build
	EMBER_BUILD=$(BUILD) bash bench/compare.sh $(MODELS)

install: build
	cmake --install $(BUILD)

bench: build
	$(BUILD)/ember run scripts/bench_dispatch.lua

clean:
	rm -rf $(BUILD) build-asan
