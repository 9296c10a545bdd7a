// runtime_bench.cpp — host cost of the runtime's hot calls, and copy
// bandwidth as a ratio against plain memcpy of the same size measured in the
// same run.
//
//   ./build/bench/runtime_bench                 (or: make bench)
//
// Targets (issue: runtime): enqueue of an empty kernel <= 0.5 us median on
// the host thread; copies >= 0.8x memcpy from 1 MiB up.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "neuron/runtime.h"

namespace {

void check(nrtStatus st) {
  if (st != NRT_SUCCESS) {
    std::fprintf(stderr, "runtime call failed: %s\n", nrtGetLastErrorMessage());
    std::abort();
  }
}

nrtStatus emptyKernel(void*) { return NRT_SUCCESS; }

nrtStream_t benchStream() {
  static nrtStream_t s = [] {
    nrtStream_t st;
    check(nrtStreamCreate(&st, 0, 0));
    return st;
  }();
  return s;
}

// Host-side cost of queueing one empty kernel. The queue is drained every
// 4096 launches outside the timed region so it never grows without bound.
void BM_EnqueueEmptyKernel(benchmark::State& state) {
  nrtStream_t s = benchStream();
  int pending = 0;
  for (auto _ : state) {
    check(nrtLaunchKernel(s, "empty", emptyKernel, nullptr, 0));
    if (++pending == 4096) {
      state.PauseTiming();
      check(nrtStreamSynchronize(s));
      pending = 0;
      state.ResumeTiming();
    }
  }
  check(nrtStreamSynchronize(s));
}
BENCHMARK(BM_EnqueueEmptyKernel)->Repetitions(10)->ReportAggregatesOnly(true);

// Launch of an empty kernel followed by a stream synchronize.
void BM_LaunchSyncRoundTrip(benchmark::State& state) {
  nrtStream_t s = benchStream();
  for (auto _ : state) {
    check(nrtLaunchKernel(s, "empty", emptyKernel, nullptr, 0));
    check(nrtStreamSynchronize(s));
  }
}
BENCHMARK(BM_LaunchSyncRoundTrip)->Repetitions(5)->ReportAggregatesOnly(true);

enum Kind { kMemcpy, kH2D, kD2H, kD2D, kD2DAsync, kD2DPeer };
const char* kindName(int k) {
  static const char* names[] = {"memcpy", "H2D", "D2H", "D2D", "D2D_async", "D2D_peer"};
  return names[k];
}

struct Buffers {
  void* host = nullptr;
  void* host2 = nullptr;
  void* dev0 = nullptr;
  void* dev0b = nullptr;
  void* dev1 = nullptr;
  size_t size = 0;
};

// One set of buffers per size, touched once so page faults are not timed.
Buffers& buffers(size_t size) {
  static std::map<size_t, Buffers> all;
  Buffers& b = all[size];
  if (!b.host) {
    b.size = size;
    b.host = std::malloc(size);
    b.host2 = std::malloc(size);
    std::memset(b.host, 1, size);
    std::memset(b.host2, 2, size);
    check(nrtMalloc(&b.dev0, size, 0));
    check(nrtMalloc(&b.dev0b, size, 0));
    check(nrtMalloc(&b.dev1, size, 1));
    check(nrtMemset(b.dev0, 3, size));
    check(nrtMemset(b.dev0b, 4, size));
    check(nrtMemset(b.dev1, 5, size));
  }
  return b;
}

void BM_Copy(benchmark::State& state) {
  const int kind = static_cast<int>(state.range(0));
  const size_t size = static_cast<size_t>(state.range(1));
  Buffers& b = buffers(size);
  nrtStream_t s = benchStream();
  for (auto _ : state) {
    switch (kind) {
      case kMemcpy: std::memcpy(b.host2, b.host, size); break;
      case kH2D: check(nrtMemcpy(b.dev0, b.host, size, nrtMemcpyHostToDevice)); break;
      case kD2H: check(nrtMemcpy(b.host2, b.dev0, size, nrtMemcpyDeviceToHost)); break;
      case kD2D: check(nrtMemcpy(b.dev0b, b.dev0, size, nrtMemcpyDeviceToDevice)); break;
      case kD2DAsync:
        check(nrtMemcpyAsync(b.dev0b, b.dev0, size, nrtMemcpyDeviceToDevice, s));
        check(nrtStreamSynchronize(s));
        break;
      case kD2DPeer: check(nrtMemcpy(b.dev1, b.dev0, size, nrtMemcpyDeviceToDevice)); break;
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(size));
  state.SetLabel(kindName(kind));
}

void copyArgs(benchmark::internal::Benchmark* bm) {
  for (int64_t size = 4 << 10; size <= (256 << 20); size *= 4)
    for (int k = kMemcpy; k <= kD2DPeer; ++k) bm->Args({k, size});
}
BENCHMARK(BM_Copy)->Apply(copyArgs)->MinTime(0.05)->UseRealTime()->Repetitions(5)->ReportAggregatesOnly(true);

// Collects copy bandwidths so the summary can print ratios against memcpy.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      std::string name = r.benchmark_name();
      // The median of the repetitions is the figure least disturbed by other
      // load on the machine.
      if (name.rfind("BM_Copy/", 0) != 0 || r.run_type != Run::RT_Aggregate ||
          r.aggregate_name != "median")
        continue;
      int kind = std::atoi(name.c_str() + 8);
      long long size = std::atoll(std::strchr(name.c_str() + 8, '/') + 1);

      auto it = r.counters.find("bytes_per_second");
      if (it != r.counters.end()) bw_[size][kind] = it->second.value;
    }
  }
  void summary() const {
    std::printf("\nCopy bandwidth as a ratio of memcpy (same size, same run); target >= 0.80 "
                "from 1 MiB\n");
    std::printf("%10s %10s", "size", "memcpy GB/s");
    for (int k = kH2D; k <= kD2DPeer; ++k) std::printf(" %10s", kindName(k));
    std::printf("\n");
    for (const auto& [size, byKind] : bw_) {
      auto base = byKind.find(kMemcpy);
      if (base == byKind.end()) continue;
      std::printf("%9lldK %11.2f", size >> 10, base->second / 1e9);
      for (int k = kH2D; k <= kD2DPeer; ++k) {
        auto it = byKind.find(k);
        std::printf(" %10.2f", it == byKind.end() ? 0.0 : it->second / base->second);
      }
      std::printf("\n");
    }
  }

 private:
  std::map<long long, std::map<int, double>> bw_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.summary();
  benchmark::Shutdown();
  return 0;
}
