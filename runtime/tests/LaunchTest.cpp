// LaunchTest.cpp — kernel launch: where kernels run, argument copies, names,
// and how failures surface (and that streams keep working afterwards).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <pthread.h>

#include "TestUtil.h"

namespace {

nrtStatus recordThreadName(void* a) {
  char* out = *static_cast<char**>(a);
#if defined(__linux__)
  if (pthread_getname_np(pthread_self(), out, 16) != 0) out[0] = '\0';
#endif
  return NRT_SUCCESS;
}

struct ThreadArgs {
  std::thread::id* out;
  nrtStream_t* streamOut;
};
nrtStatus recordThread(void* a) {
  auto* args = static_cast<ThreadArgs*>(a);
  *args->out = std::this_thread::get_id();
  *args->streamOut = nrtKernelCurrentStream();
  return NRT_SUCCESS;
}

struct BigArgs {
  int values[64];  // larger than the inline argument buffer
  int* sum;
};
nrtStatus sumKernel(void* a) {
  auto* args = static_cast<BigArgs*>(a);
  int total = 0;
  for (int v : args->values) total += v;
  *args->sum = total;
  return NRT_SUCCESS;
}

nrtStatus failingKernel(void*) {
  nrtKernelSetError("index 7 is out of bounds for size 3");
  return NRT_ERROR_INVALID_VALUE;
}

}  // namespace

#if defined(__linux__)
// The device's threads are named after it (ps, top, perf and debuggers tell
// them from the host's); a launch-blocking kernel runs on the caller's.
TEST(Launch, ExecutorThreadsAreNamedAfterTheDevice) {
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  char name[16] = "unset";
  char* out = name;
  NRT_OK(nrtLaunchKernel(s, "aten::who_am_i", recordThreadName, &out, sizeof out));
  NRT_OK(nrtStreamSynchronize(s));
  if (launchBlocking()) {
    char mine[16] = "";
    ASSERT_EQ(pthread_getname_np(pthread_self(), mine, sizeof mine), 0);
    EXPECT_STREQ(name, mine);
  } else {
    EXPECT_EQ(std::strncmp(name, "neuron0-exec", 12), 0) << name;
  }
  NRT_OK(nrtStreamDestroy(s));
}
#endif

TEST(Launch, RunsOnExecutorUnlessBlocking) {
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  std::thread::id where;
  nrtStream_t seen = 0;
  ThreadArgs args{&where, &seen};
  NRT_OK(nrtLaunchKernel(s, "aten::where_am_i", recordThread, &args, sizeof args));
  NRT_OK(nrtStreamSynchronize(s));
  if (launchBlocking()) EXPECT_EQ(where, std::this_thread::get_id());
  else EXPECT_NE(where, std::this_thread::get_id());
  EXPECT_EQ(seen, s);
  EXPECT_EQ(nrtKernelCurrentStream(), 0u);
  NRT_OK(nrtStreamDestroy(s));
}

namespace {
std::mutex gIdleMu;
std::vector<std::thread::id> gIdleThreads;
void recordIdle() {
  std::lock_guard<std::mutex> lk(gIdleMu);
  gIdleThreads.push_back(std::this_thread::get_id());
}
// Waits up to 2 s for the idle hook to have run `n` times in all.
size_t idleCallsAfterWaiting(size_t n) {
  for (int i = 0; i < 2000; ++i) {
    {
      std::lock_guard<std::mutex> lk(gIdleMu);
      if (gIdleThreads.size() >= n) return gIdleThreads.size();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::lock_guard<std::mutex> lk(gIdleMu);
  return gIdleThreads.size();
}
}  // namespace

TEST(Launch, IdleHookRunsOnTheWorkerOncePerIdleSpell) {
  if (launchBlocking()) GTEST_SKIP() << "blocking mode runs kernels on the caller";
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  // Workers still polling after earlier tests' work end that idle spell first.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  NRT_OK(nrtSetWorkerIdleHook(recordIdle));
  for (int spell = 1; spell <= 2; ++spell) {
    std::thread::id where;
    nrtStream_t seen = 0;
    ThreadArgs args{&where, &seen};
    NRT_OK(nrtLaunchKernel(s, "aten::where_am_i", recordThread, &args, sizeof args));
    NRT_OK(nrtStreamSynchronize(s));
    // The worker that ran the kernel goes idle and runs the hook before it
    // sleeps (other workers may have run it at their own idle spells too).
    idleCallsAfterWaiting(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // well past the polling
    std::lock_guard<std::mutex> lk(gIdleMu);
    ASSERT_FALSE(gIdleThreads.empty());
    EXPECT_EQ(std::count(gIdleThreads.begin(), gIdleThreads.end(), where), 1)
        << "spell " << spell << ": once on the kernel's worker";
    gIdleThreads.clear();
  }
  // Asleep workers run nothing more; without a hook, nothing runs.
  NRT_OK(nrtSetWorkerIdleHook(nullptr));
  NRT_OK(nrtLaunchKernel(s, "aten::noop", [](void*) { return NRT_SUCCESS; }, nullptr, 0));
  NRT_OK(nrtStreamSynchronize(s));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(idleCallsAfterWaiting(0), 0u);
  NRT_OK(nrtStreamDestroy(s));
}

namespace {
std::atomic<int> gSlowHookState{0};  // 1: running, 2: finished
void slowIdleHook() {
  gSlowHookState.store(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  gSlowHookState.store(2);
}
}  // namespace

TEST(Launch, RemovingTheIdleHookWaitsForARunningCall) {
  // What the exit path relies on: once the hook is removed, none of it runs.
  if (launchBlocking()) GTEST_SKIP() << "blocking mode runs kernels on the caller";
  gSlowHookState.store(0);
  NRT_OK(nrtSetWorkerIdleHook(slowIdleHook));
  NRT_OK(nrtLaunchKernel(defaultStream(), "aten::noop", [](void*) { return NRT_SUCCESS; },
                         nullptr, 0));
  NRT_OK(nrtStreamSynchronize(defaultStream()));
  for (int i = 0; i < 2000 && gSlowHookState.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(gSlowHookState.load(), 1) << "the worker went idle and is in the hook";
  NRT_OK(nrtSetWorkerIdleHook(nullptr));
  EXPECT_EQ(gSlowHookState.load(), 2);
}

namespace {
std::atomic<bool> gGateOpen{false};
std::atomic<int> gThrottles{0};
std::atomic<long> gRan{0};
nrtStatus gateKernel(void*) {
  while (!gGateOpen.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  return NRT_SUCCESS;
}
nrtStatus countKernel(void*) {
  gRan.fetch_add(1);
  return NRT_SUCCESS;
}
void onThrottle(nrtStream_t) { gThrottles.fetch_add(1); }
}  // namespace

// A host that never synchronizes cannot queue without bound: past the queue
// depth (16384 by default) a launch waits for the stream to run half of its
// items, after telling the hook; then it goes on, and everything runs.
TEST(Launch, AFullQueueMakesTheLaunchWait) {
  if (launchBlocking()) GTEST_SKIP() << "blocking mode queues nothing";
  constexpr long kDepth = 16384, kLaunches = 3 * kDepth;
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  gGateOpen.store(false);
  gThrottles.store(0);
  gRan.store(0);
  NRT_OK(nrtSetLaunchThrottleHook(onThrottle));
  // Opens the gate once the launching thread waits (or after 10 s, so that a
  // launch that never waits fails the test instead of hanging it).
  std::atomic<long> launchedWhenThrottled{-1};
  std::atomic<long> launched{0};
  std::thread opener([&] {
    for (int i = 0; i < 10000 && gThrottles.load() == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    launchedWhenThrottled.store(launched.load());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gGateOpen.store(true);
  });
  NRT_OK(nrtLaunchKernel(s, "gate", gateKernel, nullptr, 0));
  for (long i = 0; i < kLaunches; ++i) {
    NRT_OK(nrtLaunchKernel(s, "count", countKernel, nullptr, 0));
    launched.store(i + 1);
  }
  opener.join();
  NRT_OK(nrtStreamSynchronize(s));
  NRT_OK(nrtSetLaunchThrottleHook(nullptr));
  EXPECT_GE(gThrottles.load(), 1);
  // It waited at the first look past the depth (looks are 64 launches apart).
  EXPECT_GE(launchedWhenThrottled.load(), kDepth - 64);
  EXPECT_LE(launchedWhenThrottled.load(), kDepth + 64);
  EXPECT_EQ(gRan.load(), kLaunches);
  NRT_OK(nrtStreamDestroy(s));
}

TEST(Launch, ArgumentsAreCopiedAtLaunch) {
  nrtStream_t s = defaultStream(1);
  int sum = 0;
  {
    BigArgs args;
    for (int i = 0; i < 64; ++i) args.values[i] = i;
    args.sum = &sum;
    NRT_OK(nrtLaunchKernel(s, "sum", sumKernel, &args, sizeof args));
    std::memset(&args, 0xFF, sizeof args);  // the kernel must not see this
  }
  NRT_OK(nrtStreamSynchronize(s));
  EXPECT_EQ(sum, 63 * 64 / 2);
}

TEST(Launch, InvalidArguments) {
  EXPECT_EQ(nrtLaunchKernel(defaultStream(), "x", nullptr, nullptr, 0), NRT_ERROR_INVALID_VALUE);
  EXPECT_EQ(nrtLaunchKernel(defaultStream(), "x", sleepKernel, nullptr, 8), NRT_ERROR_INVALID_VALUE);
  EXPECT_EQ(nrtKernelSetError("outside"), NRT_ERROR_INVALID_VALUE);
}

TEST(Launch, FailureIsReportedOnceWithKernelName) {
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  nrtStatus launched = nrtLaunchKernel(s, "aten::index.Tensor (at Index.cpp:12)", failingKernel,
                                       nullptr, 0);
  nrtStatus sync = nrtStreamSynchronize(s);
  // Blocking mode reports at the launch; otherwise at the next sync.
  EXPECT_EQ(launchBlocking() ? launched : sync, NRT_ERROR_KERNEL_FAILED);
  EXPECT_EQ(launchBlocking() ? sync : launched, NRT_SUCCESS);
  std::string msg = nrtGetLastErrorMessage();
  EXPECT_NE(msg.find("aten::index.Tensor (at Index.cpp:12)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("out of bounds"), std::string::npos) << msg;
  // Reported once; the stream stays usable.
  NRT_OK(nrtStreamSynchronize(s));
  NRT_OK(nrtStreamQuery(s));
  LogArgs a{5};
  takeLog();
  NRT_OK(nrtLaunchKernel(s, "log", logKernel, &a, sizeof a));
  NRT_OK(nrtStreamSynchronize(s));
  EXPECT_EQ(takeLog(), std::vector<int>{5});
  NRT_OK(nrtStreamDestroy(s));
}

// A name the caller may reuse (nameLasts 0, as nrtLaunchKernel passes it) is
// copied at the launch, cut at 95 characters; one that lasts is kept as given.
TEST(Launch, NamesAreCopiedUnlessTheyLast) {
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  SleepArgs hold{20000};  // the name changes while the item is still queued
  NRT_OK(nrtLaunchKernel(s, "hold", sleepKernel, &hold, sizeof hold));
  std::string name = "user::" + std::string(120, 'k');
  nrtWorkDesc desc{};
  desc.name = name.c_str();
  desc.kind = nrtWorkKernel;
  nrtStatus launched = nrtLaunchWork(s, &desc, failingKernel, nullptr, 0, nullptr);
  name.assign(name.size(), 'x');  // the caller's buffer changes before the kernel runs
  nrtStatus sync = nrtStreamSynchronize(s);
  EXPECT_EQ(launchBlocking() ? launched : sync, NRT_ERROR_KERNEL_FAILED);
  std::string msg = nrtGetLastErrorMessage();
  EXPECT_NE(msg.find("user::" + std::string(89, 'k')), std::string::npos) << msg;
  EXPECT_EQ(msg.find(std::string(90, 'k')), std::string::npos) << msg;
  EXPECT_EQ(msg.find("xxxx"), std::string::npos) << msg;
  // A short one goes behind the arguments, inside the task.
  char shortName[] = "short::name";
  SleepArgs args{1};
  desc.name = shortName;
  NRT_OK(nrtLaunchKernel(s, "hold", sleepKernel, &hold, sizeof hold));
  launched = nrtLaunchWork(s, &desc, failingKernel, &args, sizeof args, nullptr);
  std::memset(shortName, 'x', sizeof shortName - 1);
  sync = nrtStreamSynchronize(s);
  EXPECT_EQ(launchBlocking() ? launched : sync, NRT_ERROR_KERNEL_FAILED);
  msg = nrtGetLastErrorMessage();
  EXPECT_NE(msg.find("'short::name'"), std::string::npos) << msg;
  static const char kLasting[] = "lasting::name";
  desc.name = kLasting;
  desc.nameLasts = 1;
  launched = nrtLaunchWork(s, &desc, failingKernel, nullptr, 0, nullptr);
  sync = nrtStreamSynchronize(s);
  EXPECT_EQ(launchBlocking() ? launched : sync, NRT_ERROR_KERNEL_FAILED);
  msg = nrtGetLastErrorMessage();
  EXPECT_NE(msg.find("lasting::name"), std::string::npos) << msg;
  NRT_OK(nrtStreamSynchronize(s));
  NRT_OK(nrtStreamDestroy(s));
}

// Every failure queued before a synchronization is reported by it, in order,
// each by its kernel's name; an event reports those before its record only.
TEST(Launch, EveryFailureBeforeASyncIsNamed) {
  if (launchBlocking()) GTEST_SKIP() << "blocking mode reports failures at launch";
  nrtStream_t s, t;
  NRT_OK(nrtStreamCreate(&s, 1, 0));
  NRT_OK(nrtStreamCreate(&t, 1, 0));
  nrtEvent_t e;
  NRT_OK(nrtEventCreate(&e, 0));
  SleepArgs gate{20000};  // keeps the failures queued until all are launched
  NRT_OK(nrtLaunchKernel(s, "sleep", sleepKernel, &gate, sizeof gate));
  NRT_OK(nrtLaunchKernel(s, "fail-one", failingKernel, nullptr, 0));
  NRT_OK(nrtEventRecord(e, s));
  NRT_OK(nrtLaunchKernel(s, "fail-two", failingKernel, nullptr, 0));
  NRT_OK(nrtLaunchKernel(s, "fail-three", failingKernel, nullptr, 0));
  EXPECT_EQ(nrtEventSynchronize(e), NRT_ERROR_KERNEL_FAILED);
  std::string msg = nrtGetLastErrorMessage();
  EXPECT_NE(msg.find("fail-one"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("fail-two"), std::string::npos) << msg;  // after the record
  EXPECT_EQ(nrtStreamSynchronize(s), NRT_ERROR_KERNEL_FAILED);
  msg = nrtGetLastErrorMessage();
  EXPECT_EQ(msg.find("fail-one"), std::string::npos) << msg;  // reported already
  const size_t two = msg.find("fail-two"), three = msg.find("fail-three");
  EXPECT_NE(two, std::string::npos) << msg;
  EXPECT_NE(three, std::string::npos) << msg;
  EXPECT_LT(two, three) << msg;
  NRT_OK(nrtStreamSynchronize(s));
  // Failures on two streams: the device's synchronization names both.
  NRT_OK(nrtLaunchKernel(s, "fail-on-s", failingKernel, nullptr, 0));
  NRT_OK(nrtLaunchKernel(t, "fail-on-t", failingKernel, nullptr, 0));
  EXPECT_EQ(nrtDeviceSynchronize(1), NRT_ERROR_KERNEL_FAILED);
  msg = nrtGetLastErrorMessage();
  EXPECT_NE(msg.find("fail-on-s"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fail-on-t"), std::string::npos) << msg;
  NRT_OK(nrtDeviceSynchronize(1));
  NRT_OK(nrtEventDestroy(e));
  NRT_OK(nrtStreamDestroy(t));
  NRT_OK(nrtStreamDestroy(s));
}

TEST(Launch, FailureSurfacesThroughQueryEventAndDevice) {
  if (launchBlocking()) GTEST_SKIP() << "blocking mode reports failures at launch";
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 1, 0));
  // Query.
  NRT_OK(nrtLaunchKernel(s, "fail-a", failingKernel, nullptr, 0));
  nrtStatus st;
  while ((st = nrtStreamQuery(s)) == NRT_ERROR_NOT_READY) std::this_thread::yield();
  EXPECT_EQ(st, NRT_ERROR_KERNEL_FAILED);
  NRT_OK(nrtStreamQuery(s));
  // Event synchronize: the failure before the record travels with the event.
  nrtEvent_t e;
  NRT_OK(nrtEventCreate(&e, 0));
  NRT_OK(nrtLaunchKernel(s, "fail-b", failingKernel, nullptr, 0));
  NRT_OK(nrtEventRecord(e, s));
  EXPECT_EQ(nrtEventSynchronize(e), NRT_ERROR_KERNEL_FAILED);
  EXPECT_NE(std::string(nrtGetLastErrorMessage()).find("fail-b"), std::string::npos);
  NRT_OK(nrtEventSynchronize(e));
  NRT_OK(nrtStreamSynchronize(s));  // already reported through the event
  // Device synchronize.
  NRT_OK(nrtLaunchKernel(s, "fail-c", failingKernel, nullptr, 0));
  EXPECT_EQ(nrtDeviceSynchronize(1), NRT_ERROR_KERNEL_FAILED);
  EXPECT_NE(std::string(nrtGetLastErrorMessage()).find("fail-c"), std::string::npos);
  NRT_OK(nrtDeviceSynchronize(1));
  NRT_OK(nrtEventDestroy(e));
  NRT_OK(nrtStreamDestroy(s));
}

TEST(Launch, LastErrorMessageIsPerThread) {
  EXPECT_EQ(nrtFree(reinterpret_cast<void*>(16)), NRT_ERROR_INVALID_POINTER);
  std::string mine = nrtGetLastErrorMessage();
  EXPECT_NE(mine.find("NRT_ERROR_INVALID_POINTER"), std::string::npos);
  std::thread([] { EXPECT_STREQ(nrtGetLastErrorMessage(), ""); }).join();
}
