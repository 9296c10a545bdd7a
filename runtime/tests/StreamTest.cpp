// StreamTest.cpp — stream lifetime, priorities, ordering, query and sync.
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "TestUtil.h"

namespace {

struct SpinArgs {
  int micros;
};
// Busy for `micros`: the worker stays on its core, as a compute kernel does.
nrtStatus spinKernel(void* a) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::microseconds(static_cast<SpinArgs*>(a)->micros);
  while (std::chrono::steady_clock::now() < until) {
  }
  return NRT_SUCCESS;
}

// Times this thread went to sleep (each futex wait that blocks counts one).
long voluntarySwitches() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_nvcsw;
}

}  // namespace

TEST(Stream, CreateDestroyAndUseAfterDestroy) {
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 1, 0));
  int device = -1;
  NRT_OK(nrtStreamGetDevice(s, &device));
  EXPECT_EQ(device, 1);
  NRT_OK(nrtStreamDestroy(s));
  EXPECT_EQ(nrtStreamQuery(s), NRT_ERROR_INVALID_HANDLE);
  EXPECT_NE(std::string(nrtGetLastErrorMessage()).find("not a live stream"), std::string::npos);
  EXPECT_EQ(nrtStreamSynchronize(s), NRT_ERROR_INVALID_HANDLE);
  EXPECT_EQ(nrtStreamDestroy(s), NRT_ERROR_INVALID_HANDLE);
  LogArgs a{1};
  EXPECT_EQ(nrtLaunchKernel(s, "log", logKernel, &a, sizeof a), NRT_ERROR_INVALID_HANDLE);
  EXPECT_EQ(nrtStreamGetDevice(s, &device), NRT_ERROR_INVALID_HANDLE);
  // A new stream may reuse the slot; the old handle stays dead.
  nrtStream_t t;
  NRT_OK(nrtStreamCreate(&t, 1, 0));
  EXPECT_NE(t, s);
  EXPECT_EQ(nrtStreamQuery(s), NRT_ERROR_INVALID_HANDLE);
  NRT_OK(nrtStreamDestroy(t));
  EXPECT_EQ(nrtStreamQuery(0), NRT_ERROR_INVALID_HANDLE);
  EXPECT_EQ(nrtStreamCreate(nullptr, 0, 0), NRT_ERROR_INVALID_VALUE);
}

TEST(Stream, DefaultStreamCannotBeDestroyed) {
  nrtStream_t d0 = defaultStream(0), d1 = defaultStream(1);
  EXPECT_NE(d0, d1);
  EXPECT_EQ(nrtStreamDestroy(d0), NRT_ERROR_INVALID_HANDLE);
  NRT_OK(nrtStreamQuery(d0));
}

TEST(Stream, PrioritiesAreClampedNeverRejected) {
  nrtDeviceProperties p;
  NRT_OK(nrtGetDeviceProperties(&p, 0));
  for (int prio : {-1000, -2, -1, 0, 1, 1000}) {
    nrtStream_t s;
    NRT_OK(nrtStreamCreate(&s, 0, prio));
    int got = 99;
    NRT_OK(nrtStreamGetPriority(s, &got));
    int want = prio < p.streamPriorityGreatest ? p.streamPriorityGreatest
               : prio > p.streamPriorityLeast  ? p.streamPriorityLeast
                                               : prio;
    EXPECT_EQ(got, want) << "priority " << prio;
    NRT_OK(nrtStreamDestroy(s));
  }
}

TEST(Stream, RunsInOrder) {
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, -1));
  takeLog();
  std::vector<int> expect;
  for (int i = 0; i < 500; ++i) {
    LogArgs a{i};
    NRT_OK(nrtLaunchKernel(s, "log", logKernel, &a, sizeof a));
    expect.push_back(i);
  }
  NRT_OK(nrtStreamSynchronize(s));
  EXPECT_EQ(takeLog(), expect);
  NRT_OK(nrtStreamDestroy(s));
}

TEST(Stream, QueryReportsPendingWork) {
  if (launchBlocking()) GTEST_SKIP() << "NEURON_LAUNCH_BLOCKING=1 leaves nothing pending";
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  NRT_OK(nrtStreamQuery(s));
  static std::atomic<bool> release{false};
  release = false;
  auto gate = [](void*) -> nrtStatus {
    while (!release.load()) std::this_thread::yield();
    return NRT_SUCCESS;
  };
  NRT_OK(nrtLaunchKernel(s, "gate", gate, nullptr, 0));
  EXPECT_EQ(nrtStreamQuery(s), NRT_ERROR_NOT_READY);
  release = true;
  NRT_OK(nrtStreamSynchronize(s));
  NRT_OK(nrtStreamQuery(s));
  NRT_OK(nrtStreamDestroy(s));
}

TEST(Stream, DestroyWaitsForQueuedWork) {
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 1, 0));
  takeLog();
  SleepArgs sl{10000};
  LogArgs a{42};
  NRT_OK(nrtLaunchKernel(s, "sleep", sleepKernel, &sl, sizeof sl));
  NRT_OK(nrtLaunchKernel(s, "log", logKernel, &a, sizeof a));
  NRT_OK(nrtStreamDestroy(s));
  EXPECT_EQ(takeLog(), std::vector<int>{42});
}

TEST(Stream, SynchronizeWakesWhenTheWorkIsDoneNotPerTask) {
  if (launchBlocking()) GTEST_SKIP() << "work runs on the calling thread";
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  SpinArgs a{50};
  for (int i = 0; i < 400; ++i) NRT_OK(nrtLaunchKernel(s, "spin", spinKernel, &a, sizeof a));
  const long before = voluntarySwitches();
  NRT_OK(nrtStreamSynchronize(s));
  const long slept = voluntarySwitches() - before;
  // Woken at every task completion the waiter would sleep again ~400 times
  // (a core taken from the kernels each time); woken at the end it sleeps
  // once, plus one per 2 ms bound on a missed wake-up (~10 over 20 ms).
  EXPECT_LT(slept, 60) << "the waiter was woken " << slept << " times for 400 tasks";
  NRT_OK(nrtStreamDestroy(s));
}
