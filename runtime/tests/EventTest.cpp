// EventTest.cpp — event record, query, synchronize, elapsed time, waits.
#include <atomic>
#include <chrono>
#include <thread>

#include "TestUtil.h"

namespace {
std::atomic<bool> gateOpen{false};
nrtStatus gateKernel(void*) {
  while (!gateOpen.load()) std::this_thread::yield();
  return NRT_SUCCESS;
}
}  // namespace

TEST(Event, CreateFlagsAndDestroy) {
  nrtEvent_t e;
  EXPECT_EQ(nrtEventCreate(&e, 0x80), NRT_ERROR_INVALID_VALUE);
  EXPECT_EQ(nrtEventCreate(nullptr, 0), NRT_ERROR_INVALID_VALUE);
  NRT_OK(nrtEventCreate(&e, NRT_EVENT_DISABLE_TIMING));
  NRT_OK(nrtEventDestroy(e));
  EXPECT_EQ(nrtEventDestroy(e), NRT_ERROR_INVALID_HANDLE);
  EXPECT_EQ(nrtEventQuery(e), NRT_ERROR_INVALID_HANDLE);
  EXPECT_EQ(nrtEventSynchronize(e), NRT_ERROR_INVALID_HANDLE);
  EXPECT_EQ(nrtEventRecord(e, defaultStream()), NRT_ERROR_INVALID_HANDLE);
  EXPECT_EQ(nrtStreamWaitEvent(defaultStream(), e), NRT_ERROR_INVALID_HANDLE);
  float ms;
  EXPECT_EQ(nrtEventElapsedTime(&ms, e, e), NRT_ERROR_INVALID_HANDLE);
}

TEST(Event, NeverRecorded) {
  nrtEvent_t e;
  NRT_OK(nrtEventCreate(&e, 0));
  EXPECT_EQ(nrtEventQuery(e), NRT_ERROR_EVENT_NOT_RECORDED);
  EXPECT_NE(std::string(nrtGetLastErrorMessage()).find("never been recorded"), std::string::npos);
  EXPECT_EQ(nrtEventSynchronize(e), NRT_ERROR_EVENT_NOT_RECORDED);
  EXPECT_EQ(nrtStreamWaitEvent(defaultStream(), e), NRT_ERROR_EVENT_NOT_RECORDED);
  nrtEvent_t f;
  NRT_OK(nrtEventCreate(&f, 0));
  NRT_OK(nrtEventRecord(f, defaultStream()));
  NRT_OK(nrtEventSynchronize(f));
  float ms;
  EXPECT_EQ(nrtEventElapsedTime(&ms, e, f), NRT_ERROR_EVENT_NOT_RECORDED);
  NRT_OK(nrtEventDestroy(e));
  // A recycled slot starts unrecorded again.
  NRT_OK(nrtEventCreate(&e, 0));
  EXPECT_EQ(nrtEventQuery(e), NRT_ERROR_EVENT_NOT_RECORDED);
  NRT_OK(nrtEventDestroy(e));
  NRT_OK(nrtEventDestroy(f));
}

TEST(Event, QueryAndSynchronizeFollowTheStream) {
  if (launchBlocking()) GTEST_SKIP() << "a gate kernel would block the launching thread";
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  nrtEvent_t e;
  NRT_OK(nrtEventCreate(&e, 0));
  gateOpen = false;
  NRT_OK(nrtLaunchKernel(s, "gate", gateKernel, nullptr, 0));
  NRT_OK(nrtEventRecord(e, s));
  EXPECT_EQ(nrtEventQuery(e), NRT_ERROR_NOT_READY);
  std::thread opener([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gateOpen = true;
  });
  NRT_OK(nrtEventSynchronize(e));
  NRT_OK(nrtEventQuery(e));
  opener.join();
  NRT_OK(nrtEventDestroy(e));
  NRT_OK(nrtStreamDestroy(s));
}

// A wait is for the record it saw (as cudaStreamWaitEvent): recording the
// event again on an idle stream, which completes at once, must not release a
// stream that waits for the earlier record, still behind a closed gate.
TEST(Event, WaitIsForItsOwnRecordNotALaterOne) {
  if (launchBlocking()) GTEST_SKIP() << "a gate kernel would block the launching thread";
  nrtStream_t gated, waiter, idle;
  NRT_OK(nrtStreamCreate(&gated, 0, 0));
  NRT_OK(nrtStreamCreate(&waiter, 0, 0));
  NRT_OK(nrtStreamCreate(&idle, 0, 0));
  nrtEvent_t e;
  NRT_OK(nrtEventCreate(&e, 0));
  gateOpen = false;
  NRT_OK(nrtLaunchKernel(gated, "gate", gateKernel, nullptr, 0));
  NRT_OK(nrtEventRecord(e, gated));
  NRT_OK(nrtStreamWaitEvent(waiter, e));
  NRT_OK(nrtEventRecord(e, idle));
  NRT_OK(nrtStreamSynchronize(idle));
  NRT_OK(nrtEventQuery(e));  // the event's state is its latest record's
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(nrtStreamQuery(waiter), NRT_ERROR_NOT_READY);
  gateOpen = true;
  NRT_OK(nrtStreamSynchronize(waiter));
  NRT_OK(nrtStreamSynchronize(gated));
  NRT_OK(nrtEventDestroy(e));
  for (nrtStream_t s : {gated, waiter, idle}) NRT_OK(nrtStreamDestroy(s));
}

TEST(Event, ElapsedTime) {
  nrtStream_t s = defaultStream(1);
  nrtEvent_t a, b, noTiming;
  NRT_OK(nrtEventCreate(&a, NRT_EVENT_DEFAULT));
  NRT_OK(nrtEventCreate(&b, NRT_EVENT_DEFAULT));
  NRT_OK(nrtEventCreate(&noTiming, NRT_EVENT_DISABLE_TIMING));
  SleepArgs sl{30000};
  NRT_OK(nrtEventRecord(a, s));
  NRT_OK(nrtLaunchKernel(s, "sleep", sleepKernel, &sl, sizeof sl));
  NRT_OK(nrtEventRecord(b, s));
  NRT_OK(nrtEventRecord(noTiming, s));
  NRT_OK(nrtEventSynchronize(b));
  float ms = 0;
  NRT_OK(nrtEventElapsedTime(&ms, a, b));
  EXPECT_GE(ms, 29.0f);
  EXPECT_LT(ms, 5000.0f);
  EXPECT_EQ(nrtEventElapsedTime(&ms, a, noTiming), NRT_ERROR_TIMING_DISABLED);
  EXPECT_EQ(nrtEventElapsedTime(nullptr, a, b), NRT_ERROR_INVALID_VALUE);
  for (nrtEvent_t e : {a, b, noTiming}) NRT_OK(nrtEventDestroy(e));
}

TEST(Event, ElapsedTimeNotReady) {
  if (launchBlocking()) GTEST_SKIP() << "a gate kernel would block the launching thread";
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  nrtEvent_t a, b;
  NRT_OK(nrtEventCreate(&a, 0));
  NRT_OK(nrtEventCreate(&b, 0));
  NRT_OK(nrtEventRecord(a, s));
  gateOpen = false;
  NRT_OK(nrtLaunchKernel(s, "gate", gateKernel, nullptr, 0));
  NRT_OK(nrtEventRecord(b, s));
  float ms;
  EXPECT_EQ(nrtEventElapsedTime(&ms, a, b), NRT_ERROR_NOT_READY);
  gateOpen = true;
  NRT_OK(nrtStreamSynchronize(s));
  NRT_OK(nrtEventElapsedTime(&ms, a, b));
  NRT_OK(nrtEventDestroy(a));
  NRT_OK(nrtEventDestroy(b));
  NRT_OK(nrtStreamDestroy(s));
}

// Closes the gate, then queues: on a new stream of device 0 (producer) the
// gate, log 1 and a record of a new event e; on a new stream of device 1
// (consumer) a wait for e and log 2. The log starts empty.
void queueCrossDeviceWait(nrtStream_t* producer, nrtStream_t* consumer, nrtEvent_t* e) {
  NRT_OK(nrtStreamCreate(producer, 0, 0));
  NRT_OK(nrtStreamCreate(consumer, 1, 0));
  NRT_OK(nrtEventCreate(e, NRT_EVENT_DISABLE_TIMING));
  takeLog();
  gateOpen = false;
  LogArgs first{1}, second{2};  // launches copy their arguments
  NRT_OK(nrtLaunchKernel(*producer, "gate", gateKernel, nullptr, 0));
  NRT_OK(nrtLaunchKernel(*producer, "log", logKernel, &first, sizeof first));
  NRT_OK(nrtEventRecord(*e, *producer));
  NRT_OK(nrtStreamWaitEvent(*consumer, *e));
  NRT_OK(nrtLaunchKernel(*consumer, "log", logKernel, &second, sizeof second));
}

TEST(Event, StreamWaitsForEventOnAnotherDevice) {
  if (launchBlocking()) GTEST_SKIP() << "a gate kernel would block the launching thread";
  nrtStream_t producer, consumer;
  nrtEvent_t e;
  queueCrossDeviceWait(&producer, &consumer, &e);
  if (HasFatalFailure()) return;
  EXPECT_EQ(nrtStreamQuery(consumer), NRT_ERROR_NOT_READY);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(takeLog().empty());  // the consumer is parked behind the event
  gateOpen = true;
  NRT_OK(nrtStreamSynchronize(consumer));
  EXPECT_EQ(takeLog(), (std::vector<int>{1, 2}));
  NRT_OK(nrtEventDestroy(e));
  NRT_OK(nrtStreamDestroy(producer));
  NRT_OK(nrtStreamDestroy(consumer));
}

TEST(Event, RerecordUsesLatestCapture) {
  if (launchBlocking()) GTEST_SKIP() << "a gate kernel would block the launching thread";
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  nrtEvent_t e;
  NRT_OK(nrtEventCreate(&e, 0));
  NRT_OK(nrtEventRecord(e, s));
  NRT_OK(nrtEventSynchronize(e));
  gateOpen = false;
  NRT_OK(nrtLaunchKernel(s, "gate", gateKernel, nullptr, 0));
  NRT_OK(nrtEventRecord(e, s));
  EXPECT_EQ(nrtEventQuery(e), NRT_ERROR_NOT_READY);
  gateOpen = true;
  NRT_OK(nrtEventSynchronize(e));
  NRT_OK(nrtEventDestroy(e));
  NRT_OK(nrtStreamDestroy(s));
}

TEST(Event, DestroyWithPendingRecordIsHarmless) {
  if (launchBlocking()) GTEST_SKIP() << "a gate kernel would block the launching thread";
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  nrtEvent_t e;
  NRT_OK(nrtEventCreate(&e, 0));
  gateOpen = false;
  NRT_OK(nrtLaunchKernel(s, "gate", gateKernel, nullptr, 0));
  NRT_OK(nrtEventRecord(e, s));
  NRT_OK(nrtEventDestroy(e));
  nrtEvent_t reused;
  NRT_OK(nrtEventCreate(&reused, 0));  // likely the same slot
  gateOpen = true;
  NRT_OK(nrtStreamSynchronize(s));
  EXPECT_EQ(nrtEventQuery(reused), NRT_ERROR_EVENT_NOT_RECORDED);
  NRT_OK(nrtEventDestroy(reused));
  NRT_OK(nrtStreamDestroy(s));
}

TEST(Event, WaitOnOwnStreamAddsNoWork) {
  if (launchBlocking()) GTEST_SKIP() << "a gate kernel would block the launching thread";
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  nrtEvent_t e;
  NRT_OK(nrtEventCreate(&e, NRT_EVENT_DISABLE_TIMING));
  gateOpen = false;
  NRT_OK(nrtLaunchKernel(s, "gate", gateKernel, nullptr, 0));
  NRT_OK(nrtEventRecord(e, s));
  NRT_OK(nrtStreamWaitEvent(s, e));  // already ordered: nothing queued
  gateOpen = true;
  NRT_OK(nrtEventSynchronize(e));
  NRT_OK(nrtStreamQuery(s));  // nothing is left behind the record
  NRT_OK(nrtEventDestroy(e));
  NRT_OK(nrtStreamDestroy(s));
}

// A stream waiting on an event keeps waiting for the recorded work even
// when the event is destroyed (and its slot possibly reused) meanwhile.
TEST(Event, DestroyWhileAStreamWaitsOnIt) {
  if (launchBlocking()) GTEST_SKIP() << "a gate kernel would block the launching thread";
  nrtStream_t producer, consumer;
  nrtEvent_t e;
  queueCrossDeviceWait(&producer, &consumer, &e);
  if (HasFatalFailure()) return;
  NRT_OK(nrtEventDestroy(e));
  nrtEvent_t others[4];
  for (auto& o : others) NRT_OK(nrtEventCreate(&o, 0));  // may take the old slot
  for (auto& o : others) NRT_OK(nrtEventRecord(o, defaultStream(0)));
  gateOpen = true;
  NRT_OK(nrtStreamSynchronize(consumer));
  EXPECT_EQ(takeLog(), (std::vector<int>{1, 2}));
  for (auto& o : others) NRT_OK(nrtEventDestroy(o));
  NRT_OK(nrtStreamDestroy(producer));
  NRT_OK(nrtStreamDestroy(consumer));
}

// After a stream (or its device) is synchronized, events recorded on it
// are complete, and after an event is synchronized the stream's work up
// to it is done — with no window in between.
TEST(Event, StreamAndEventCompletionAgree) {
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  nrtEvent_t e;
  NRT_OK(nrtEventCreate(&e, NRT_EVENT_DISABLE_TIMING));
  SleepArgs sl{200};
  for (int i = 0; i < 200; ++i) {
    NRT_OK(nrtLaunchKernel(s, "sleep", sleepKernel, &sl, sizeof sl));
    NRT_OK(nrtEventRecord(e, s));
    if (i % 3 == 0) {
      NRT_OK(nrtEventSynchronize(e));
      ASSERT_EQ(nrtStreamQuery(s), NRT_SUCCESS) << "iteration " << i;
    } else {
      NRT_OK(i % 3 == 1 ? nrtStreamSynchronize(s) : nrtDeviceSynchronize(0));
      ASSERT_EQ(nrtEventQuery(e), NRT_SUCCESS) << "iteration " << i;
    }
  }
  NRT_OK(nrtEventDestroy(e));
  NRT_OK(nrtStreamDestroy(s));
}
