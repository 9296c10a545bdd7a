# torchneuron — the two commands in the README:
#   make demo   set up, build, run the main job
#   make test   set up, build, run every test (runtime suites also under
#               ASan+UBSan and TSan; the Python suites on the neuron device)
# Other targets: build, bench, bench-py, bench-compile, bench-distributed, conformance, python-tests,
# runtime-tests, runtime-demo, sanitize, test-distributed-long, fuzz, reliability, exit-stress, clean.

VENV ?= $(HOME)/.cache/torchneuron/venv
PYTHON := $(VENV)/bin/python
JOBS ?= 2
CMAKE_FLAGS ?=
BACKEND := $(wildcard setup.py)

# ccache hits across clones of the repository (CI builds a fresh clone).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: all demo test build bench bench-py bench-parity bench-pointwise deps venv runtime-tests runtime-demo sanitize \
        asan tsan backend python-tests conformance clean fuzz fuzz-build fuzz-short \
        reliability exit-stress bench-compile bench-distributed test-distributed-long

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
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j 1

tsan: deps
	@cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DNEURON_BUILD_BENCH=OFF \
	  -DNEURON_SANITIZE=thread >/dev/null
	@cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:allocator_may_return_null=1 ctest --output-on-failure -j 1

sanitize: asan tsan

# The runtime's C API under libFuzzer with ASan+UBSan and a model of what each
# call must return (runtime/fuzz/RuntimeFuzzer.cpp). Seeds: runtime/fuzz/corpus
# (read only); what the fuzzer adds goes to build-fuzz/corpus, findings to
# build-fuzz/crash-*. `make fuzz` runs FUZZ_SECS seconds without exclusions;
# `make test` replays the seed corpus (runtime/fuzz/corpus: one input per call
# shape, and each input that once found a bug) as a regression test, with the
# known, being-fixed bugs skipped (NRT_FUZZ_SKIP_KNOWN=1, listed at the top of
# RuntimeFuzzer.cpp): the same inputs on every run, so CI does not fail by
# chance. Exploring new inputs is `make fuzz`'s job.
FUZZ_SECS ?= 60
FUZZ_FLAGS = -max_len=1024 -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
  -artifact_prefix=build-fuzz/
fuzz-build: deps
	@cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DNEURON_SANITIZE=address;undefined" \
	  -DNEURON_BUILD_FUZZ=ON -DNEURON_BUILD_TESTS=OFF -DNEURON_BUILD_BENCH=OFF >/dev/null
	@cmake --build build-fuzz -j $(JOBS)
	@mkdir -p build-fuzz/corpus

fuzz: fuzz-build
	UBSAN_OPTIONS=print_stacktrace=1 ./build-fuzz/runtime/fuzz/runtime_fuzzer $(FUZZ_FLAGS) \
	  -max_total_time=$(FUZZ_SECS) build-fuzz/corpus runtime/fuzz/corpus

fuzz-short: fuzz-build
	NRT_FUZZ_SKIP_KNOWN=1 UBSAN_OPTIONS=print_stacktrace=1 ./build-fuzz/runtime/fuzz/runtime_fuzzer \
	  $(FUZZ_FLAGS) runtime/fuzz/corpus/*

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

test: runtime-tests sanitize fuzz-short python-tests reliability

# The 4-process distributed runs (DCP resharded onto 4 ranks, FSDP x TP on a
# 2-D mesh) and TorchTitan at 4 ranks: minutes on 2 cores, so not in make test.
test-distributed-long: backend
ifneq ($(BACKEND),)
	NEURON_SLOW_DISTRIBUTED=1 $(PYTHON) -m pytest -q -m slow_distributed tests
endif

# Bad inputs across the Python API and a training soak, crash- and
# hang-isolated (tests/reliability/run.py); once, not under both launch modes.
reliability: backend
ifneq ($(BACKEND),)
	$(PYTHON) tests/reliability/run.py --report build/reliability.json
endif

# Every OpInfo (op_db) and ModuleInfo (module_db) on neuron vs CPU, every
# sample; reports in build/conformance.json and build/modules.json; then 89
# OpInfo ops compiled (torch.compile) on neuron vs on CPU, build/compiled.json. Each suite
# runs as SHARDS shards in parallel (--shard i/n), merged into one report that
# must cover every op and module; both suites run even if the first fails.
SHARDS ?= $(JOBS)
conformance: backend
	@mkdir -p build/shards
	@rm -f build/shards/opinfo-*.json build/shards/modules-*.json
	@status=0; start=$$(date +%s); \
	for suite in opinfo modules; do \
	  for i in $$(seq 1 $(SHARDS)); do \
	    $(PYTHON) tests/conformance/$$suite.py --shard $$i/$(SHARDS) --quiet \
	      --report build/shards/$$suite-$$i.json & \
	  done; \
	  wait; \
	done; \
	$(PYTHON) tests/conformance/opinfo.py --merge 'build/shards/opinfo-*.json' \
	  --report build/conformance.json || status=1; \
	$(PYTHON) tests/conformance/modules.py --merge 'build/shards/modules-*.json' \
	  --report build/modules.json || status=1; \
	$(PYTHON) tests/conformance/compiled.py --report build/compiled.json || status=1; \
	echo "conformance: $$(( $$(date +%s) - start )) s with $(SHARDS) shards per suite"; \
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
	$(PYTHON) bench/bench_train_step.py --models resnet18,llama

# Pointwise chains (GELU-tanh, LayerNorm, AdamW) on 1M and 16M elements, neuron
# vs CPU eager, and the fraction of a STREAM-style triad's bandwidth they reach.
bench-pointwise: backend
	$(PYTHON) bench/bench_pointwise.py

# torch.compile: compiled neuron vs compiled CPU vs eager CPU, and compile time.
bench-compile: backend
	$(PYTHON) bench/bench_compile.py

# torch.distributed: collective bandwidth, a DDP step and FSDP2 memory, 2 ranks,
# neuron vs Gloo on CPU tensors.
bench-distributed: backend
	$(PYTHON) bench/bench_distributed.py

# Custom kernels: the kernel library's fused RMSNorm vs the eager composition
# on neuron and CPU eager.
bench-kernels: backend
	$(PYTHON) bench/bench_kernels.py

# Every ATen call of a training step: the device's kernel time vs CPU eager's.
bench-parity: backend
	$(PYTHON) bench/bench_kernel_parity.py --models gpt,resnet18,llama

runtime-demo: build
	./build/examples/runtime_demo

# The main job: a small GPT trained on neuron and on CPU, compared step by step,
# eager and under torch.compile.
demo: backend
	$(PYTHON) examples/train_gpt.py --compile
	$(PYTHON) examples/train_gpt_distributed.py

clean:
	rm -rf build build-asan build-tsan build-fuzz
