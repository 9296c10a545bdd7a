// DeviceTest.cpp — device count, properties, current device, device sync.
#include <algorithm>
#include <thread>

#include "TestUtil.h"

TEST(Device, CountAndProperties) {
  int count = 0;
  NRT_OK(nrtGetDeviceCount(&count));
  ASSERT_GE(count, 2);
  for (int d = 0; d < count; ++d) {
    nrtDeviceProperties p;
    NRT_OK(nrtGetDeviceProperties(&p, d));
    EXPECT_NE(std::string(p.name).find("NeuronCore"), std::string::npos);
    EXPECT_EQ(p.totalMemory, expectedCapacity());
    EXPECT_GE(p.computeThreads, 1);
    EXPECT_GE(p.executorThreads, 1);
    EXPECT_EQ(p.physicalCore, d);
    EXPECT_EQ(p.streamPriorityLeast, 0);
    EXPECT_LT(p.streamPriorityGreatest, 0);
  }
}

TEST(Device, InvalidDevice) {
  int count = 0;
  NRT_OK(nrtGetDeviceCount(&count));
  nrtDeviceProperties p;
  EXPECT_EQ(nrtGetDeviceProperties(&p, count), NRT_ERROR_INVALID_DEVICE);
  EXPECT_NE(std::string(nrtGetLastErrorMessage()).find("does not exist"), std::string::npos);
  EXPECT_EQ(nrtGetDeviceProperties(&p, -1), NRT_ERROR_INVALID_DEVICE);
  EXPECT_EQ(nrtSetDevice(count), NRT_ERROR_INVALID_DEVICE);
  EXPECT_EQ(nrtDeviceSynchronize(count), NRT_ERROR_INVALID_DEVICE);
  size_t f, t;
  EXPECT_EQ(nrtMemGetInfo(-3, &f, &t), NRT_ERROR_INVALID_DEVICE);
  void* ptr;
  EXPECT_EQ(nrtMalloc(&ptr, 64, count), NRT_ERROR_INVALID_DEVICE);
  nrtStream_t s;
  EXPECT_EQ(nrtStreamCreate(&s, count, 0), NRT_ERROR_INVALID_DEVICE);
  EXPECT_EQ(nrtStreamGetDefault(&s, count), NRT_ERROR_INVALID_DEVICE);
}

TEST(Device, NullArguments) {
  EXPECT_EQ(nrtGetDeviceCount(nullptr), NRT_ERROR_INVALID_VALUE);
  EXPECT_EQ(nrtGetDeviceProperties(nullptr, 0), NRT_ERROR_INVALID_VALUE);
  EXPECT_EQ(nrtGetDevice(nullptr), NRT_ERROR_INVALID_VALUE);
  size_t f;
  EXPECT_EQ(nrtMemGetInfo(0, &f, nullptr), NRT_ERROR_INVALID_VALUE);
}

TEST(Device, CurrentDeviceIsPerThread) {
  NRT_OK(nrtSetDevice(1));
  int d = -1;
  NRT_OK(nrtGetDevice(&d));
  EXPECT_EQ(d, 1);
  std::thread([] {
    int other = -1;
    EXPECT_EQ(nrtGetDevice(&other), NRT_SUCCESS);
    EXPECT_EQ(other, 0);
  }).join();
  NRT_OK(nrtSetDevice(0));
}

TEST(Device, MemGetInfoTracksAllocations) {
  size_t free0, total;
  NRT_OK(nrtMemGetInfo(1, &free0, &total));
  EXPECT_EQ(total, expectedCapacity());
  void* p;
  NRT_OK(nrtMalloc(&p, 1 << 20, 1));
  size_t free1;
  NRT_OK(nrtMemGetInfo(1, &free1, &total));
  EXPECT_EQ(free0 - free1, size_t(1) << 20);
  NRT_OK(nrtFree(p));
  NRT_OK(nrtMemGetInfo(1, &free1, &total));
  EXPECT_EQ(free1, free0);
}

TEST(Device, LargestFreeRangeSeesFragmentation) {
  NRT_OK(nrtDeviceSynchronize(1));
  size_t largest = 0, free0 = 0, total = 0;
  NRT_OK(nrtMemGetLargestFreeRange(1, &largest));
  NRT_OK(nrtMemGetInfo(1, &free0, &total));
  EXPECT_EQ(largest, free0);  // nothing allocated on device 1: one free range
  // Four quarters, the 1st and 3rd freed: half the arena is free, in two
  // ranges of a quarter each.
  const size_t quarter = total / 4 / NRT_DEVICE_ALIGNMENT * NRT_DEVICE_ALIGNMENT;
  void* q[4];
  for (auto& p : q) NRT_OK(nrtMalloc(&p, quarter, 1));
  NRT_OK(nrtFree(q[0]));
  NRT_OK(nrtFree(q[2]));
  size_t free1 = 0;
  NRT_OK(nrtMemGetInfo(1, &free1, &total));
  NRT_OK(nrtMemGetLargestFreeRange(1, &largest));
  EXPECT_GE(free1, 2 * quarter);
  EXPECT_LT(largest, 2 * quarter);
  EXPECT_GE(largest, quarter);
  void* p = nullptr;
  EXPECT_EQ(nrtMalloc(&p, largest + NRT_DEVICE_ALIGNMENT, 1), NRT_ERROR_OUT_OF_MEMORY);
  NRT_OK(nrtMalloc(&p, largest, 1));  // exactly the largest range fits
  NRT_OK(nrtFree(p));
  NRT_OK(nrtFree(q[1]));
  NRT_OK(nrtFree(q[3]));
  NRT_OK(nrtMemGetLargestFreeRange(1, &largest));
  EXPECT_EQ(largest, free0);  // freed ranges coalesce again
  EXPECT_EQ(nrtMemGetLargestFreeRange(1, nullptr), NRT_ERROR_INVALID_VALUE);
  EXPECT_EQ(nrtMemGetLargestFreeRange(-1, &largest), NRT_ERROR_INVALID_DEVICE);
}

TEST(Device, SynchronizeWaitsForAllStreams) {
  nrtStream_t a, b;
  NRT_OK(nrtStreamCreate(&a, 0, 0));
  NRT_OK(nrtStreamCreate(&b, 0, -1));
  SleepArgs sl{20000};
  LogArgs la{1}, lb{2}, ld{3};
  takeLog();
  NRT_OK(nrtLaunchKernel(a, "sleep", sleepKernel, &sl, sizeof sl));
  NRT_OK(nrtLaunchKernel(a, "log", logKernel, &la, sizeof la));
  NRT_OK(nrtLaunchKernel(b, "sleep", sleepKernel, &sl, sizeof sl));
  NRT_OK(nrtLaunchKernel(b, "log", logKernel, &lb, sizeof lb));
  NRT_OK(nrtLaunchKernel(defaultStream(0), "log", logKernel, &ld, sizeof ld));
  NRT_OK(nrtDeviceSynchronize(0));
  auto log = takeLog();
  std::sort(log.begin(), log.end());
  EXPECT_EQ(log, (std::vector<int>{1, 2, 3}));
  NRT_OK(nrtStreamDestroy(a));
  NRT_OK(nrtStreamDestroy(b));
}

TEST(Status, NamesAndStrings) {
  EXPECT_STREQ(nrtGetErrorName(NRT_SUCCESS), "NRT_SUCCESS");
  EXPECT_STREQ(nrtGetErrorName(NRT_ERROR_OUT_OF_MEMORY), "NRT_ERROR_OUT_OF_MEMORY");
  for (int s = 0; s <= NRT_ERROR_FORKED; ++s) {
    EXPECT_NE(std::string(nrtGetErrorName(static_cast<nrtStatus>(s))), "NRT_ERROR_UNKNOWN");
    EXPECT_GT(std::string(nrtGetErrorString(static_cast<nrtStatus>(s))).size(), 3u);
  }
  EXPECT_STREQ(nrtGetErrorName(static_cast<nrtStatus>(999)), "NRT_ERROR_UNKNOWN");
}
