// ActivityTest.cpp — work records: identities given at launch (name, kind,
// correlation, buffers) come back in activity records with device times, in
// stream order; recording off records nothing; copies and memsets are work
// items of their own kinds.
#include <cstring>
#include <thread>
#include <vector>

#include "TestUtil.h"

namespace {

nrtStatus noop(void*) { return NRT_SUCCESS; }
nrtStatus failing(void*) {
  nrtKernelSetError("bad index");
  return NRT_ERROR_INVALID_VALUE;
}

std::vector<nrtActivityRecord> drain() {
  std::vector<nrtActivityRecord> out(4096);
  size_t n = 0;
  EXPECT_EQ(nrtActivityDrain(out.data(), out.size(), &n, nullptr), NRT_SUCCESS);
  out.resize(n);
  return out;
}

struct Recording {
  Recording() {
    drain();
    EXPECT_EQ(nrtActivityEnable(1), NRT_SUCCESS);
  }
  ~Recording() { nrtActivityEnable(0); }
};

}  // namespace

TEST(Activity, RecordsIdentityTimesAndOrder) {
  nrtStream_t s = 0;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  std::vector<nrtActivityRecord> recs;
  uint64_t idA = 0, idB = 0;
  {
    Recording on;
    const uint64_t before = nrtActivityTimestampNs();
    SleepArgs sleep{2000};
    int in = 0, out = 0;
    nrtBufferRange r{&in, sizeof in}, w{&out, sizeof out};
    nrtWorkDesc a{};
    a.name = "aten::slow";
    a.kind = nrtWorkKernel;
    a.correlationId = 41;
    a.reads = &r;
    a.numReads = 1;
    a.writes = &w;
    a.numWrites = 1;
    NRT_OK(nrtLaunchWork(s, &a, sleepKernel, &sleep, sizeof sleep, &idA));
    NRT_OK(nrtPushCorrelationId(42));
    nrtWorkDesc b{};
    b.name = "aten::next";
    b.kind = nrtWorkGraph;
    NRT_OK(nrtLaunchWork(s, &b, noop, nullptr, 0, &idB));
    NRT_OK(nrtPopCorrelationId());
    NRT_OK(nrtStreamSynchronize(s));
    recs = drain();
    ASSERT_EQ(recs.size(), 2u);
    EXPECT_GT(idB, idA);
    const auto& ra = recs[0];
    const auto& rb = recs[1];
    EXPECT_EQ(ra.workId, idA);
    EXPECT_STREQ(ra.name, "aten::slow");
    EXPECT_EQ(ra.kind, nrtWorkKernel);
    EXPECT_EQ(ra.correlationId, 41u);
    EXPECT_EQ(ra.stream, s);
    EXPECT_EQ(ra.device, 0);
    EXPECT_EQ(ra.status, NRT_SUCCESS);
    ASSERT_EQ(ra.numReads, 1u);
    EXPECT_EQ(ra.reads[0].ptr, &in);
    EXPECT_EQ(ra.writes[0].bytes, sizeof out);
    EXPECT_GE(ra.queuedNs, before);
    EXPECT_LE(ra.queuedNs, ra.startNs);
    EXPECT_GE(ra.endNs - ra.startNs, 2000u * 1000u);  // it slept 2 ms
    EXPECT_STREQ(rb.name, "aten::next");
    EXPECT_EQ(rb.kind, nrtWorkGraph);
    EXPECT_EQ(rb.correlationId, 42u);  // from the thread's stack
    EXPECT_GE(rb.startNs, ra.endNs);   // stream order
  }
  EXPECT_EQ(nrtCurrentCorrelationId(), 0u);
  EXPECT_EQ(nrtPopCorrelationId(), NRT_ERROR_INVALID_VALUE);
  NRT_OK(nrtStreamDestroy(s));
}

TEST(Activity, OffRecordsNothing) {
  drain();
  NRT_OK(nrtActivityEnable(0));
  NRT_OK(nrtLaunchKernel(defaultStream(), "quiet", noop, nullptr, 0));
  NRT_OK(nrtStreamSynchronize(defaultStream()));
  EXPECT_TRUE(drain().empty());
}

TEST(Activity, CopiesMemsetsAndFailuresAreWorkItems) {
  void* dev = nullptr;
  NRT_OK(nrtMalloc(&dev, 4096, 0));
  std::vector<char> host(4096, 7);
  {
    Recording on;
    NRT_OK(nrtMemcpyAsync(dev, host.data(), 4096, nrtMemcpyHostToDevice, defaultStream()));
    NRT_OK(nrtMemsetAsync(dev, 0, 1024, defaultStream()));
    NRT_OK(nrtMemcpy(host.data(), dev, 4096, nrtMemcpyDeviceToHost));  // synchronous
    nrtStatus st = nrtLaunchKernel(defaultStream(), "aten::fails", failing, nullptr, 0);
    if (st == NRT_SUCCESS) st = nrtStreamSynchronize(defaultStream());
    EXPECT_EQ(st, NRT_ERROR_KERNEL_FAILED);
    auto recs = drain();
    ASSERT_EQ(recs.size(), 4u);
    EXPECT_EQ(recs[0].kind, nrtWorkCopy);
    EXPECT_EQ(recs[0].bytes, 4096u);
    EXPECT_STREQ(recs[0].name, "Memcpy HtoD (Host -> Device)");
    EXPECT_EQ(recs[1].kind, nrtWorkMemset);
    EXPECT_EQ(recs[1].bytes, 1024u);
    EXPECT_EQ(recs[2].kind, nrtWorkCopy);
    EXPECT_STREQ(recs[2].name, "Memcpy DtoH (Device -> Host)");
    EXPECT_EQ(recs[2].stream, defaultStream());
    EXPECT_STREQ(recs[3].name, "aten::fails");
    EXPECT_EQ(recs[3].status, NRT_ERROR_INVALID_VALUE);
  }
  EXPECT_EQ(host[0], 0);
  EXPECT_EQ(host[2048], 7);
  NRT_OK(nrtFree(dev));
}

TEST(Activity, BadDescriptors) {
  EXPECT_EQ(nrtLaunchWork(defaultStream(), nullptr, noop, nullptr, 0, nullptr),
            NRT_ERROR_INVALID_VALUE);
  nrtWorkDesc d{};
  d.kind = static_cast<nrtWorkKind>(99);
  EXPECT_EQ(nrtLaunchWork(defaultStream(), &d, noop, nullptr, 0, nullptr),
            NRT_ERROR_INVALID_VALUE);
  d.kind = nrtWorkKernel;
  d.numReads = 2;
  EXPECT_EQ(nrtLaunchWork(defaultStream(), &d, noop, nullptr, 0, nullptr),
            NRT_ERROR_INVALID_VALUE);
  size_t n = 0;
  EXPECT_EQ(nrtActivityDrain(nullptr, 4, &n, nullptr), NRT_ERROR_INVALID_VALUE);
  EXPECT_EQ(nrtActivityDrain(nullptr, 0, nullptr, nullptr), NRT_ERROR_INVALID_VALUE);
}
