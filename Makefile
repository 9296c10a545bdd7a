# torchneuron — the two commands in the README:
#   make demo   set up, build, run the main job
#   make test   set up, build, run every test (runtime suites also under
#               ASan+UBSan and TSan; the Python suites on the neuron device)
# Other targets: build, bench, bench-py, conformance, python-tests,
# runtime-tests, runtime-demo, sanitize, exit-stress, clean.

VENV ?= $(HOME)/.cache/torchneuron/venv
PYTHON := $(VENV)/bin/python
JOBS ?= 2
CMAKE_FLAGS ?=
BACKEND := $(wildcard setup.py)

# ccache hits across clones of the repository (CI builds a fresh clone).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: all demo test build bench bench-py deps venv runtime-tests runtime-demo sanitize \
        asan tsan backend python-tests conformance exit-stress clean

all: build

deps:
	@scripts/setup.sh system

venv: deps
	@scripts/setup.sh python

# build/ is the plain (RelWithDebInfo) build of the runtime, its tests,
# benchmarks and examples.
build: deps
	@cmake -S . -B build -G Ninja -DNEURON_BUILD_TESTS=ON -DNEURON_BUILD_BENCH=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build build -j $(JOBS)

runtime-tests: build
	cd build && ctest --output-on-failure -j 1

asan: deps
	@cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DNEURON_BUILD_BENCH=OFF \
	  "-DNEURON_SANITIZE=address;undefined" >/dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j 1

tsan: deps
	@cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DNEURON_BUILD_BENCH=OFF \
	  -DNEURON_SANITIZE=thread >/dev/null
	@cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j 1

sanitize: asan tsan

# The PyTorch backend, built by setup.py against the venv's torch.
backend: venv
ifneq ($(BACKEND),)
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 MAX_JOBS=$(JOBS) $(PYTHON) -m pip install -q --no-build-isolation -e .
endif

# The suites run twice: as shipped, and with NEURON_LAUNCH_BLOCKING=1 (every
# launch synchronous; tests that observe asynchrony skip themselves).
python-tests: backend
ifneq ($(BACKEND),)
	$(PYTHON) -m pytest -q tests
	NEURON_LAUNCH_BLOCKING=1 $(PYTHON) -m pytest -q tests
endif

test: runtime-tests sanitize python-tests

# Every OpInfo (op_db) and ModuleInfo (module_db) on neuron vs CPU; reports in
# build/conformance.json and build/modules.json. Both suites run even if the first fails.
conformance: backend
	@mkdir -p build
	@status=0; \
	$(PYTHON) tests/conformance/opinfo.py --report build/conformance.json || status=1; \
	$(PYTHON) tests/conformance/modules.py --report build/modules.json || status=1; \
	exit $$status

# Processes that run a backward on neuron and exit, counted by how they end
# (make test runs 50 of them in tests/test_process.py).
EXIT_RUNS ?= 200
exit-stress: backend
	$(PYTHON) scripts/exit_stress.py --runs $(EXIT_RUNS)
	$(PYTHON) scripts/exit_stress.py --runs 20 --fresh

bench: build
	./build/bench/runtime_bench

bench-py: backend
	$(PYTHON) bench/bench_small_ops.py
	$(PYTHON) bench/bench_train_step.py

runtime-demo: build
	./build/examples/runtime_demo

# The main job: a small GPT trained on neuron and on CPU, compared step by step.
demo: backend
	$(PYTHON) examples/train_gpt.py

clean:
	rm -rf build build-asan build-tsan
