// SelfWaitTest.cpp — a kernel that waits for its own stream or device would
// wait for itself forever; such calls return INVALID_VALUE at once.
#include <string>
#include <thread>

#include "TestUtil.h"

namespace {

enum Wait { kStreamSync, kDeviceSync, kOtherDeviceSync, kEventSync, kStreamDestroy, kSyncCopy };

struct WaitArgs {
  Wait what;
  nrtStream_t other;  // a stream the kernel may wait for
  nrtEvent_t event;   // recorded after this kernel on its stream
  int device;
  nrtStatus* status;
  std::string* message;
};

nrtStatus waitingKernel(void* a) {
  auto* w = static_cast<WaitArgs*>(a);
  nrtStatus st = NRT_SUCCESS;
  switch (w->what) {
    case kStreamSync: st = nrtStreamSynchronize(nrtKernelCurrentStream()); break;
    case kDeviceSync: st = nrtDeviceSynchronize(w->device); break;
    case kOtherDeviceSync: st = nrtDeviceSynchronize(1 - w->device); break;
    case kEventSync:
      // The host records the event right after launching us: wait until it
      // has (the kernel may start first), bounded so a bug cannot hang.
      for (int i = 0; i < 5000000 && nrtEventQuery(w->event) == NRT_ERROR_EVENT_NOT_RECORDED; ++i)
        std::this_thread::yield();
      st = nrtEventSynchronize(w->event);
      break;
    case kStreamDestroy: st = nrtStreamDestroy(nrtKernelCurrentStream()); break;
    case kSyncCopy: {
      void* d = nullptr;
      st = nrtMalloc(&d, 64, w->device);
      char host[64] = {};
      if (st == NRT_SUCCESS) st = nrtMemcpy(d, host, sizeof host, nrtMemcpyHostToDevice);
      nrtFree(d);
      break;
    }
  }
  *w->status = st;
  *w->message = nrtGetLastErrorMessage();
  return NRT_SUCCESS;
}

// Runs the waiting kernel on a fresh stream of device and returns its status.
nrtStatus runWait(Wait what, int device, std::string* message) {
  nrtStream_t s;
  EXPECT_EQ(nrtStreamCreate(&s, device, 0), NRT_SUCCESS);
  nrtEvent_t ev;
  EXPECT_EQ(nrtEventCreate(&ev, NRT_EVENT_DISABLE_TIMING), NRT_SUCCESS);
  nrtStatus status = NRT_ERROR_INTERNAL;
  WaitArgs args{what, 0, ev, device, &status, message};
  EXPECT_EQ(nrtLaunchKernel(s, "waitingKernel", waitingKernel, &args, sizeof args), NRT_SUCCESS);
  EXPECT_EQ(nrtEventRecord(ev, s), NRT_SUCCESS);
  EXPECT_EQ(nrtStreamSynchronize(s), NRT_SUCCESS) << nrtGetLastErrorMessage();
  EXPECT_EQ(nrtEventDestroy(ev), NRT_SUCCESS);
  EXPECT_EQ(nrtStreamDestroy(s), NRT_SUCCESS);
  return status;
}

}  // namespace

TEST(SelfWait, KernelCannotSynchronizeItsOwnStream) {
  std::string msg;
  EXPECT_EQ(runWait(kStreamSync, 0, &msg), NRT_ERROR_INVALID_VALUE);
  EXPECT_NE(msg.find("cannot wait for its own stream"), std::string::npos) << msg;
  EXPECT_EQ(runWait(kStreamDestroy, 0, &msg), NRT_ERROR_INVALID_VALUE);
  EXPECT_NE(msg.find("cannot wait for its own stream"), std::string::npos) << msg;
  EXPECT_EQ(runWait(kEventSync, 1, &msg), NRT_ERROR_INVALID_VALUE);
  EXPECT_NE(msg.find("cannot wait for its own stream"), std::string::npos) << msg;
}

TEST(SelfWait, KernelCannotSynchronizeItsOwnDevice) {
  std::string msg;
  EXPECT_EQ(runWait(kDeviceSync, 1, &msg), NRT_ERROR_INVALID_VALUE);
  EXPECT_NE(msg.find("cannot wait for its own device"), std::string::npos) << msg;
  // A synchronous copy waits for the device first: refused the same way.
  EXPECT_EQ(runWait(kSyncCopy, 0, &msg), NRT_ERROR_INVALID_VALUE);
  EXPECT_NE(msg.find("cannot wait for its own device"), std::string::npos) << msg;
}

TEST(SelfWait, KernelMayWaitForAnotherDevice) {
  std::string msg;
  EXPECT_EQ(runWait(kOtherDeviceSync, 0, &msg), NRT_SUCCESS) << msg;
}

TEST(SelfWait, HostThreadsStillWait) {
  // Outside a kernel the same calls wait as usual.
  NRT_OK(nrtStreamSynchronize(defaultStream()));
  NRT_OK(nrtDeviceSynchronize(0));
  EXPECT_EQ(nrtKernelCurrentStream(), 0u);
}
