// FusionTest.cpp — the executor hands runs of queued items that name the
// same fuser to it in one call; what the fuser takes is done, what it leaves
// is offered again; failures are named after the item the fuser names.
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "TestUtil.h"

namespace {

// Each item's argument block: its tag, and a log both paths append to.
struct Item {
  int tag;
};

std::mutex gMu;
std::vector<std::vector<int>> gCalls;  // one entry per fuser call: the tags offered
std::vector<int> gAlone;               // tags run by their own function

nrtStatus alone(void* a) {
  std::lock_guard<std::mutex> lk(gMu);
  gAlone.push_back(static_cast<Item*>(a)->tag);
  return NRT_SUCCESS;
}

// Takes at most `limit` items; fails on the item tagged `failTag`.
struct TestFuser : nrtFuser {
  size_t limit = NRT_MAX_FUSED;
  int failTag = -1;
  TestFuser() { run = &TestFuser::runFn; }
  static nrtStatus runFn(nrtFuser* self, void* const* args, size_t count, size_t* ran,
                         size_t* failed) {
    auto* f = static_cast<TestFuser*>(self);
    std::vector<int> tags;
    for (size_t k = 0; k < count; ++k) tags.push_back(static_cast<Item*>(args[k])->tag);
    {
      std::lock_guard<std::mutex> lk(gMu);
      gCalls.push_back(tags);
    }
    *ran = count < f->limit ? count : f->limit;
    for (size_t k = 0; k < *ran; ++k) {
      if (tags[k] == f->failTag) {
        *failed = k;
        nrtKernelSetError("value 9 out of range");
        return NRT_ERROR_INVALID_VALUE;
      }
    }
    return NRT_SUCCESS;
  }
};

void reset() {
  std::lock_guard<std::mutex> lk(gMu);
  gCalls.clear();
  gAlone.clear();
}

void launch(nrtStream_t s, nrtFuser* fuser, int tag) {
  nrtWorkDesc d{};
  std::string name = "test::item" + std::to_string(tag);
  d.name = name.c_str();
  d.kind = nrtWorkKernel;
  d.fuser = fuser;
  Item item{tag};
  ASSERT_EQ(nrtLaunchWork(s, &d, alone, &item, sizeof item, nullptr), NRT_SUCCESS)
      << nrtGetLastErrorMessage();
}

// Holds the stream until released, so that the items behind queue up. The
// worker takes a batch of what is queued when it starts one: the items are
// launched once the gate runs, so that none shares the gate's batch.
std::atomic<bool> gRelease{false};
std::atomic<bool> gEntered{false};
nrtStatus gate(void*) {
  gEntered = true;
  while (!gRelease.load()) std::this_thread::yield();
  return NRT_SUCCESS;
}
void closeGate(nrtStream_t s) {
  gRelease = false;
  gEntered = false;
  ASSERT_EQ(nrtLaunchKernel(s, "test::gate", gate, nullptr, 0), NRT_SUCCESS);
  while (!gEntered.load()) std::this_thread::yield();
}

}  // namespace

// Each test: a fresh stream, empty logs, and the gate closed on the stream
// (launched items queue behind it until the test sets gRelease).
class Fusion : public ::testing::Test {
 protected:
  void SetUp() override {
    if (launchBlocking()) GTEST_SKIP() << "items run alone under NEURON_LAUNCH_BLOCKING=1";
    reset();
    NRT_OK(nrtStreamCreate(&s, 0, 0));
    closeGate(s);
  }
  void TearDown() override {
    if (s) NRT_OK(nrtStreamDestroy(s));
  }
  // Opens the gate and waits for what queued behind it.
  nrtStatus release() {
    gRelease = true;
    return nrtStreamSynchronize(s);
  }
  nrtStream_t s = 0;
};

TEST_F(Fusion, QueuedRunsGoToTheFuserAndEventsEndThem) {
  nrtEvent_t e;
  NRT_OK(nrtEventCreate(&e, 0));
  TestFuser a, b;
  for (int t = 0; t < 3; ++t) launch(s, &a, t);
  launch(s, &b, 3);  // another fuser ends the run
  launch(s, &b, 4);
  NRT_OK(nrtEventRecord(e, s));  // so does an event
  launch(s, &b, 5);
  launch(s, nullptr, 6);  // and an item that runs alone
  launch(s, &a, 7);       // a run of one runs alone
  NRT_OK(release());
  EXPECT_EQ(gCalls, (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4}}));
  EXPECT_EQ(gAlone, (std::vector<int>{5, 6, 7}));
  NRT_OK(nrtEventDestroy(e));
}

TEST_F(Fusion, WhatTheFuserLeavesIsOfferedAgain) {
  TestFuser f;
  f.limit = 2;
  for (int t = 0; t < 5; ++t) launch(s, &f, t);
  NRT_OK(release());
  // {0,1} taken of five, {2,3} of three, and the last alone.
  EXPECT_EQ(gCalls, (std::vector<std::vector<int>>{{0, 1, 2, 3, 4}, {2, 3, 4}}));
  EXPECT_EQ(gAlone, (std::vector<int>{4}));
}

TEST_F(Fusion, ARunIsNotCutWhereTheWorkersBatchEnds) {
  // 33 items queued: the worker takes 32 (its batch) when the gate opens.
  // The fuser takes 31 of them; the 32nd, last of the batch, is offered
  // with the 33rd, which the worker takes from the queue for it, rather
  // than running alone.
  TestFuser f;
  f.limit = NRT_MAX_FUSED - 1;
  for (int t = 0; t < NRT_MAX_FUSED + 1; ++t) launch(s, &f, t);
  NRT_OK(release());
  ASSERT_EQ(gCalls.size(), 2u);
  EXPECT_EQ(gCalls[0].size(), size_t{NRT_MAX_FUSED});
  EXPECT_EQ(gCalls[1], (std::vector<int>{NRT_MAX_FUSED - 1, NRT_MAX_FUSED}));
  EXPECT_TRUE(gAlone.empty());
}

TEST_F(Fusion, AFailureIsNamedAfterItsItemAndTheStreamGoesOn) {
  TestFuser f;
  f.failTag = 2;
  for (int t = 0; t < 4; ++t) launch(s, &f, t);
  EXPECT_EQ(release(), NRT_ERROR_KERNEL_FAILED);
  const std::string msg = nrtGetLastErrorMessage();
  EXPECT_NE(msg.find("test::item2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("value 9 out of range"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fused pass of 4"), std::string::npos) << msg;
  // Reported once; the stream keeps working.
  launch(s, nullptr, 10);
  NRT_OK(nrtStreamSynchronize(s));
}

TEST_F(Fusion, EachItemKeepsItsActivityRecord) {
  nrtActivityRecord sink[64];
  size_t n = 0;
  NRT_OK(nrtActivityDrain(sink, 64, &n, nullptr));  // what earlier tests left
  NRT_OK(nrtActivityEnable(1));  // before the items launch: they carry records
  TestFuser f;
  for (int t = 0; t < 3; ++t) launch(s, &f, t);
  NRT_OK(release());
  NRT_OK(nrtActivityEnable(0));
  NRT_OK(nrtActivityDrain(sink, 64, &n, nullptr));
  ASSERT_EQ(n, 3u);  // the three items (the gate launched before recording)
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(sink[k].name, "test::item" + std::to_string(k));
    EXPECT_EQ(sink[k].fusedCount, 3u);
    EXPECT_EQ(sink[k].fusedWith, sink[0].workId);
    EXPECT_EQ(sink[k].startNs, sink[0].startNs);
    EXPECT_EQ(sink[k].status, NRT_SUCCESS);
  }
}
