// ConcurrencyTest.cpp — many threads, many streams, cross-stream waits.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "TestUtil.h"
#include "../src/Executor.h"

namespace {

// Each stage adds its index into a device buffer slot after checking that
// the previous stage (possibly on another stream/device) already ran.
struct StageArgs {
  std::atomic<int>* counter;
  int expectBefore;
  int* violations;
};
nrtStatus stageKernel(void* a) {
  auto* s = static_cast<StageArgs*>(a);
  int before = s->counter->fetch_add(1);
  if (before != s->expectBefore) ++*s->violations;
  return NRT_SUCCESS;
}

}  // namespace

// Several host threads each drive a pipeline across streams on both devices;
// every hop is ordered only by an event, and each kernel checks it ran after
// the previous hop.
TEST(Concurrency, ThreadsStreamsAndEventChains) {
  constexpr int kThreads = 4, kHops = 6, kRounds = 50;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<nrtStream_t> streams(kHops);
      for (int h = 0; h < kHops; ++h)
        if (nrtStreamCreate(&streams[h], (t + h) % 2, -(h % 3)) != NRT_SUCCESS) failures++;
      nrtEvent_t ev[kHops];
      for (auto& e : ev)
        if (nrtEventCreate(&e, NRT_EVENT_DISABLE_TIMING) != NRT_SUCCESS) failures++;
      for (int r = 0; r < kRounds; ++r) {
        std::atomic<int> counter{0};
        int violations = 0;
        for (int h = 0; h < kHops; ++h) {
          if (h > 0 && nrtStreamWaitEvent(streams[h], ev[h - 1]) != NRT_SUCCESS) failures++;
          StageArgs a{&counter, h, &violations};
          if (nrtLaunchKernel(streams[h], "stage", stageKernel, &a, sizeof a) != NRT_SUCCESS)
            failures++;
          if (nrtEventRecord(ev[h], streams[h]) != NRT_SUCCESS) failures++;
        }
        if (nrtEventSynchronize(ev[kHops - 1]) != NRT_SUCCESS) failures++;
        if (counter.load() != kHops || violations != 0) failures++;
      }
      for (auto e : ev) nrtEventDestroy(e);
      for (auto s : streams) nrtStreamDestroy(s);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

// The launch throttle's decision when other threads' launches ran between
// the launcher's two reads (completed > launched): no wait. The unsigned
// difference used to wrap, and a launcher early in a stream's life waited
// for a count near 2^64 forever (SharedStreamKeepsPerThreadOrder below hung
// about once in 100 runs under TSan).
TEST(Concurrency, LaunchThrottleSurvivesLaunchesRunBetweenItsReads) {
  using nrt::Executor;
  constexpr uint64_t kDepth = 16384;
  EXPECT_EQ(Executor::throttleTarget(896, 900, kDepth), 0u);
  EXPECT_EQ(Executor::throttleTarget(896, 896, kDepth), 0u);
  EXPECT_EQ(Executor::throttleTarget(64, 1000000, 64), 0u);
  // A full queue still waits, for half of it to run.
  EXPECT_EQ(Executor::throttleTarget(kDepth + 64, 0, kDepth), kDepth / 2 + 64);
  EXPECT_EQ(Executor::throttleTarget(kDepth, 0, kDepth), 0u);  // exactly full: no wait
  EXPECT_EQ(Executor::throttleTarget(100000, 100000 - kDepth - 1, kDepth), 100000 - kDepth / 2);
}

// Many threads enqueue on one shared stream; each thread's own kernels must
// run in that thread's order.
TEST(Concurrency, SharedStreamKeepsPerThreadOrder) {
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 1, 0));
  takeLog();
  constexpr int kThreads = 4, kEach = 300;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([s, t] {
      for (int i = 0; i < kEach; ++i) {
        LogArgs a{t * 100000 + i};
        EXPECT_EQ(nrtLaunchKernel(s, "log", logKernel, &a, sizeof a), NRT_SUCCESS);
      }
    });
  }
  for (auto& th : threads) th.join();
  NRT_OK(nrtStreamSynchronize(s));
  auto log = takeLog();
  ASSERT_EQ(log.size(), size_t(kThreads * kEach));
  std::vector<int> last(kThreads, -1);
  for (int v : log) {
    int t = v / 100000, i = v % 100000;
    EXPECT_EQ(i, last[t] + 1);
    last[t] = i;
  }
  NRT_OK(nrtStreamDestroy(s));
}

// A launch that meets the stream's worker giving the stream up (it polled
// the inbox for a while and found nothing) must still run: each launch here
// comes at another distance from the worker's polling deadline, and must
// run without any later call to push it along.
TEST(Concurrency, LaunchesAcrossTheIdleHandOffAreNeverStranded) {
  if (launchBlocking()) GTEST_SKIP() << "blocking mode runs kernels on the caller";
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  std::atomic<int> ran{0};
  auto bump = [](void* a) {
    (*static_cast<std::atomic<int>**>(a))->fetch_add(1);
    return NRT_SUCCESS;
  };
  std::atomic<int>* p = &ran;
  for (int i = 0; i < 1500; ++i) {
    // 170 to 250 us after the last kernel ran, in steps of 53 ns: across the
    // end of the worker's 200 us poll (Executor.cpp, kSpin).
    auto gap = std::chrono::nanoseconds(170000 + (i * 53) % 80000);
    auto until = std::chrono::steady_clock::now() + gap;
    while (std::chrono::steady_clock::now() < until) {
    }
    NRT_OK(nrtLaunchKernel(s, "bump", bump, &p, sizeof p));
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (ran.load() != i + 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    if (ran.load() != i + 1) {
      ADD_FAILURE() << "launch " << i << " was left in the inbox";
      NRT_OK(nrtLaunchKernel(s, "bump", bump, &p, sizeof p));  // schedules the stream again
      break;
    }
  }
  NRT_OK(nrtStreamDestroy(s));
}

// Two streams of one device make progress at the same time: each kernel
// waits for the other to start.
TEST(Concurrency, StreamsOverlap) {
  if (launchBlocking()) GTEST_SKIP() << "blocking mode serialises launches";
  nrtDeviceProperties p;
  NRT_OK(nrtGetDeviceProperties(&p, 0));
  if (p.executorThreads < 2) GTEST_SKIP() << "needs NEURON_RT_EXECUTOR_THREADS >= 2";
  static std::atomic<int> started{0};
  static std::atomic<int> met{0};
  started = 0;
  met = 0;
  auto rendezvous = [](void*) -> nrtStatus {
    started.fetch_add(1);
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 2 && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    if (started.load() >= 2) met.fetch_add(1);
    return NRT_SUCCESS;
  };
  nrtStream_t a, b;
  NRT_OK(nrtStreamCreate(&a, 0, 0));
  NRT_OK(nrtStreamCreate(&b, 0, 0));
  NRT_OK(nrtLaunchKernel(a, "rendezvous", rendezvous, nullptr, 0));
  NRT_OK(nrtLaunchKernel(b, "rendezvous", rendezvous, nullptr, 0));
  NRT_OK(nrtStreamSynchronize(a));
  NRT_OK(nrtStreamSynchronize(b));
  EXPECT_EQ(met.load(), 2);
  NRT_OK(nrtStreamDestroy(a));
  NRT_OK(nrtStreamDestroy(b));
}

// Memory calls from many threads at once keep the arena consistent.
TEST(Concurrency, ParallelAllocation) {
  constexpr int kThreads = 4, kEach = 500;
  size_t free0, total;
  NRT_OK(nrtMemGetInfo(0, &free0, &total));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<void*> mine;
      for (int i = 0; i < kEach; ++i) {
        void* p;
        if (nrtMalloc(&p, 256 * (1 + (i + t) % 7), 0) != NRT_SUCCESS) failures++;
        else mine.push_back(p);
        if (i % 3 == 0 && !mine.empty()) {
          if (nrtFree(mine.back()) != NRT_SUCCESS) failures++;
          mine.pop_back();
        }
      }
      for (void* p : mine)
        if (nrtFree(p) != NRT_SUCCESS) failures++;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  size_t free1;
  NRT_OK(nrtMemGetInfo(0, &free1, &total));
  EXPECT_EQ(free1, free0);
}
