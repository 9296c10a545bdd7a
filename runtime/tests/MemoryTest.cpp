// MemoryTest.cpp — device and pinned allocations, pointer attributes,
// memset and copies in every direction, and their error paths.
#include <cstring>
#include <numeric>
#include <vector>

#include "TestUtil.h"

namespace {
const size_t kCapacity = expectedCapacity();
}

TEST(Memory, MallocFreeAndZeroSize) {
  void* p = reinterpret_cast<void*>(1);
  NRT_OK(nrtMalloc(&p, 0, 0));
  EXPECT_EQ(p, nullptr);
  NRT_OK(nrtFree(nullptr));
  NRT_OK(nrtMalloc(&p, 1000, 0));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % NRT_DEVICE_ALIGNMENT, 0u);
  NRT_OK(nrtFree(p));
  EXPECT_EQ(nrtMalloc(nullptr, 8, 0), NRT_ERROR_INVALID_VALUE);
}

TEST(Memory, AllocationAtAndPastCapacity) {
  NRT_OK(nrtDeviceSynchronize(1));
  void* all = nullptr;
  NRT_OK(nrtMalloc(&all, kCapacity, 1));  // exactly the capacity fits
  void* more = nullptr;
  EXPECT_EQ(nrtMalloc(&more, 256, 1), NRT_ERROR_OUT_OF_MEMORY);
  std::string msg = nrtGetLastErrorMessage();
  EXPECT_NE(msg.find("capacity"), std::string::npos) << msg;
  EXPECT_NE(msg.find("device 1"), std::string::npos) << msg;
  NRT_OK(nrtFree(all));
  EXPECT_EQ(nrtMalloc(&more, kCapacity + 1, 1), NRT_ERROR_OUT_OF_MEMORY);
  // The device keeps working after an out-of-memory error.
  NRT_OK(nrtMalloc(&more, 4096, 1));
  NRT_OK(nrtFree(more));
}

TEST(Memory, OutOfMemoryNeverTouchesOtherDevice) {
  void* a = nullptr;
  NRT_OK(nrtMalloc(&a, kCapacity, 0));
  void* b = nullptr;
  NRT_OK(nrtMalloc(&b, 1024, 1));  // device 1 has its own arena
  nrtPointerAttributes at;
  NRT_OK(nrtPointerGetAttributes(&at, b));
  EXPECT_EQ(at.device, 1);
  NRT_OK(nrtFree(a));
  NRT_OK(nrtFree(b));
}

TEST(Memory, FreeErrors) {
  int local = 0;
  EXPECT_EQ(nrtFree(&local), NRT_ERROR_INVALID_POINTER);
  EXPECT_NE(std::string(nrtGetLastErrorMessage()).find("not the start"), std::string::npos);
  void* p;
  NRT_OK(nrtMalloc(&p, 4096, 0));
  EXPECT_EQ(nrtFree(static_cast<char*>(p) + 256), NRT_ERROR_INVALID_POINTER);  // interior
  NRT_OK(nrtFree(p));
  EXPECT_EQ(nrtFree(p), NRT_ERROR_INVALID_POINTER);  // double free
  void* h;
  NRT_OK(nrtHostAlloc(&h, 100));
  EXPECT_EQ(nrtFree(h), NRT_ERROR_INVALID_POINTER);  // pinned host is not device memory
  EXPECT_EQ(nrtHostFree(&local), NRT_ERROR_INVALID_POINTER);
  NRT_OK(nrtHostFree(h));
  EXPECT_EQ(nrtHostFree(h), NRT_ERROR_INVALID_POINTER);
  NRT_OK(nrtHostFree(nullptr));
  EXPECT_EQ(nrtHostAlloc(nullptr, 8), NRT_ERROR_INVALID_VALUE);
}

TEST(Memory, PointerAttributes) {
  char* d;
  NRT_OK(nrtMalloc(reinterpret_cast<void**>(&d), 10000, 1));
  nrtPointerAttributes at;
  NRT_OK(nrtPointerGetAttributes(&at, d + 9999));
  EXPECT_EQ(at.type, nrtMemoryTypeDevice);
  EXPECT_EQ(at.device, 1);
  EXPECT_EQ(at.base, d);
  EXPECT_GE(at.size, 10000u);

  char* h;
  NRT_OK(nrtHostAlloc(reinterpret_cast<void**>(&h), 5000));
  NRT_OK(nrtPointerGetAttributes(&at, h + 4000));
  EXPECT_EQ(at.type, nrtMemoryTypeHost);
  EXPECT_EQ(at.device, -1);
  EXPECT_EQ(at.base, h);
  EXPECT_EQ(at.size, 5000u);

  int local;
  NRT_OK(nrtPointerGetAttributes(&at, &local));
  EXPECT_EQ(at.type, nrtMemoryTypeUnregistered);
  EXPECT_EQ(at.base, nullptr);

  NRT_OK(nrtFree(d));
  NRT_OK(nrtPointerGetAttributes(&at, d));
  EXPECT_EQ(at.type, nrtMemoryTypeUnregistered);  // freed: no longer an allocation
  NRT_OK(nrtHostFree(h));
  EXPECT_EQ(nrtPointerGetAttributes(nullptr, d), NRT_ERROR_INVALID_VALUE);
}

TEST(Memory, CopiesInEveryDirection) {
  const size_t n = 1 << 16;
  std::vector<unsigned char> src(n), back(n, 0);
  std::iota(src.begin(), src.end(), 0);
  void *d0, *d0b, *d1;
  NRT_OK(nrtMalloc(&d0, n, 0));
  NRT_OK(nrtMalloc(&d0b, n, 0));
  NRT_OK(nrtMalloc(&d1, n, 1));
  NRT_OK(nrtMemcpy(d0, src.data(), n, nrtMemcpyHostToDevice));
  NRT_OK(nrtMemcpy(d0b, d0, n, nrtMemcpyDeviceToDevice));  // same device
  NRT_OK(nrtMemcpy(d1, d0b, n, nrtMemcpyDeviceToDevice));  // across devices
  NRT_OK(nrtMemcpy(back.data(), d1, n, nrtMemcpyDefault));  // inferred D2H
  EXPECT_EQ(back, src);
  NRT_OK(nrtMemcpy(d0, d1, 0, nrtMemcpyDeviceToDevice));  // empty copy
  NRT_OK(nrtFree(d0));
  NRT_OK(nrtFree(d0b));
  NRT_OK(nrtFree(d1));
}

TEST(Memory, AsyncCopiesAreStreamOrdered) {
  const size_t n = 1 << 20;
  std::vector<unsigned char> src(n, 7), back(n, 0);
  void* pinned;
  NRT_OK(nrtHostAlloc(&pinned, n));
  std::memset(pinned, 0, n);
  void *d0, *d1;
  NRT_OK(nrtMalloc(&d0, n, 0));
  NRT_OK(nrtMalloc(&d1, n, 1));
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  NRT_OK(nrtMemcpyAsync(d0, src.data(), n, nrtMemcpyHostToDevice, s));
  NRT_OK(nrtMemsetAsync(d0, 9, n / 2, s));
  NRT_OK(nrtMemcpyAsync(d1, d0, n, nrtMemcpyDeviceToDevice, s));
  NRT_OK(nrtMemcpyAsync(pinned, d1, n, nrtMemcpyDeviceToHost, s));
  NRT_OK(nrtStreamSynchronize(s));
  auto* out = static_cast<unsigned char*>(pinned);
  EXPECT_EQ(out[0], 9);
  EXPECT_EQ(out[n / 2 - 1], 9);
  EXPECT_EQ(out[n / 2], 7);
  EXPECT_EQ(out[n - 1], 7);
  NRT_OK(nrtStreamDestroy(s));
  NRT_OK(nrtFree(d0));
  NRT_OK(nrtFree(d1));
  NRT_OK(nrtHostFree(pinned));
}

TEST(Memory, CopyDirectionErrors) {
  std::vector<char> host(256);
  void* d;
  NRT_OK(nrtMalloc(&d, 256, 0));
  EXPECT_EQ(nrtMemcpy(d, host.data(), 256, nrtMemcpyDeviceToHost), NRT_ERROR_INVALID_DIRECTION);
  EXPECT_NE(std::string(nrtGetLastErrorMessage()).find("DeviceToHost"), std::string::npos);
  EXPECT_EQ(nrtMemcpy(host.data(), d, 256, nrtMemcpyHostToDevice), NRT_ERROR_INVALID_DIRECTION);
  EXPECT_EQ(nrtMemcpy(host.data(), host.data() + 128, 128, nrtMemcpyDeviceToDevice),
            NRT_ERROR_INVALID_DIRECTION);
  EXPECT_EQ(nrtMemcpyAsync(d, host.data(), 256, nrtMemcpyDeviceToHost, defaultStream()),
            NRT_ERROR_INVALID_DIRECTION);
  EXPECT_EQ(nrtMemcpy(d, host.data(), 256, static_cast<nrtMemcpyKind>(42)), NRT_ERROR_INVALID_VALUE);
  EXPECT_EQ(nrtMemcpy(nullptr, host.data(), 1, nrtMemcpyHostToDevice), NRT_ERROR_INVALID_VALUE);
  NRT_OK(nrtFree(d));
}

TEST(Memory, CopyRangeErrors) {
  std::vector<char> host(1024);
  void* d;
  NRT_OK(nrtMalloc(&d, 512, 0));
  EXPECT_EQ(nrtMemcpy(d, host.data(), 1024, nrtMemcpyHostToDevice), NRT_ERROR_INVALID_POINTER);
  EXPECT_NE(std::string(nrtGetLastErrorMessage()).find("runs past"), std::string::npos);
  EXPECT_EQ(nrtMemset(static_cast<char*>(d) + 256, 0, 512), NRT_ERROR_INVALID_POINTER);
  EXPECT_EQ(nrtMemset(host.data(), 0, 16), NRT_ERROR_INVALID_POINTER);
  NRT_OK(nrtFree(d));
  EXPECT_EQ(nrtMemcpy(d, host.data(), 16, nrtMemcpyHostToDevice), NRT_ERROR_INVALID_POINTER);
  EXPECT_NE(std::string(nrtGetLastErrorMessage()).find("freed"), std::string::npos);
}

TEST(Memory, MemsetSync) {
  unsigned char* d;
  NRT_OK(nrtMalloc(reinterpret_cast<void**>(&d), 4096, 1));
  NRT_OK(nrtMemset(d, 0xAB, 4096));
  std::vector<unsigned char> back(4096);
  NRT_OK(nrtMemcpy(back.data(), d, 4096, nrtMemcpyDeviceToHost));
  for (unsigned char c : back) ASSERT_EQ(c, 0xAB);
  NRT_OK(nrtFree(d));
}

// Sizes whose rounding to a page or to the arena alignment would wrap
// around to a tiny block must fail, not hand out that block.
TEST(Memory, HugeSizesFailInsteadOfWrapping) {
  void* p = reinterpret_cast<void*>(1);
  for (size_t size : {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 4094, SIZE_MAX - 4095, SIZE_MAX / 2 + 1}) {
    EXPECT_EQ(nrtHostAlloc(&p, size), NRT_ERROR_OUT_OF_MEMORY) << size;
    EXPECT_EQ(nrtMalloc(&p, size, 0), NRT_ERROR_OUT_OF_MEMORY) << size;
  }
  for (size_t size : {SIZE_MAX - 254, SIZE_MAX - 255, SIZE_MAX - 256}) {
    EXPECT_EQ(nrtMalloc(&p, size, 0), NRT_ERROR_OUT_OF_MEMORY) << size;
  }
  // Both allocators still work.
  NRT_OK(nrtHostAlloc(&p, 4096));
  std::memset(p, 1, 4096);
  NRT_OK(nrtHostFree(p));
  NRT_OK(nrtMalloc(&p, 4096, 0));
  NRT_OK(nrtFree(p));
}

// A zero-byte copy or memset touches no memory: NULL pointers are fine and
// nothing is queued, but the stream handle and the copy kind still count.
TEST(Memory, ZeroByteCopiesAndMemsetsAreNoOps) {
  NRT_OK(nrtMemcpy(nullptr, nullptr, 0, nrtMemcpyHostToDevice));
  NRT_OK(nrtMemcpy(nullptr, nullptr, 0, nrtMemcpyDeviceToDevice));
  NRT_OK(nrtMemcpyAsync(nullptr, nullptr, 0, nrtMemcpyDefault, defaultStream()));
  NRT_OK(nrtMemcpyAsync(nullptr, nullptr, 0, nrtMemcpyDeviceToHost, defaultStream(1)));
  NRT_OK(nrtMemset(nullptr, 0, 0));
  NRT_OK(nrtMemsetAsync(nullptr, 0, 0, defaultStream()));
  NRT_OK(nrtStreamSynchronize(defaultStream()));
  const nrtStream_t bogus = 0xdead0000beefull;
  EXPECT_EQ(nrtMemcpyAsync(nullptr, nullptr, 0, nrtMemcpyDefault, bogus), NRT_ERROR_INVALID_HANDLE);
  EXPECT_EQ(nrtMemcpyAsync(nullptr, nullptr, 0, nrtMemcpyDefault, 0), NRT_ERROR_INVALID_HANDLE);
  EXPECT_EQ(nrtMemsetAsync(nullptr, 0, 0, bogus), NRT_ERROR_INVALID_HANDLE);
  EXPECT_EQ(nrtMemcpy(nullptr, nullptr, 0, static_cast<nrtMemcpyKind>(42)), NRT_ERROR_INVALID_VALUE);
  EXPECT_EQ(nrtMemcpyAsync(nullptr, nullptr, 0, static_cast<nrtMemcpyKind>(0), defaultStream()),
            NRT_ERROR_INVALID_VALUE);
  // A destroyed stream is refused even for zero bytes.
  nrtStream_t s;
  NRT_OK(nrtStreamCreate(&s, 0, 0));
  NRT_OK(nrtStreamDestroy(s));
  EXPECT_EQ(nrtMemcpyAsync(nullptr, nullptr, 0, nrtMemcpyDefault, s), NRT_ERROR_INVALID_HANDLE);
  EXPECT_EQ(nrtMemsetAsync(nullptr, 0, 0, s), NRT_ERROR_INVALID_HANDLE);
}

// Ranges are checked without overflow: a count that wraps the address space
// or a host range that runs into a device arena is refused.
TEST(Memory, RangesThatWrapOrRunIntoDeviceMemoryAreRefused) {
  std::vector<char> host(64);
  void* d;
  NRT_OK(nrtMalloc(&d, 512, 0));
  EXPECT_EQ(nrtMemcpy(d, host.data(), SIZE_MAX - 8, nrtMemcpyHostToDevice),
            NRT_ERROR_INVALID_VALUE);
  EXPECT_NE(std::string(nrtGetLastErrorMessage()).find("wraps"), std::string::npos);
  EXPECT_EQ(nrtMemsetAsync(d, 0, SIZE_MAX, defaultStream()), NRT_ERROR_INVALID_VALUE);
  // A host pointer far below the arena with a count that reaches into it.
  char* below = static_cast<char*>(d) - (size_t(1) << 40);
  EXPECT_EQ(nrtMemcpy(host.data(), below, (size_t(1) << 40) + 16, nrtMemcpyDefault),
            NRT_ERROR_INVALID_POINTER);
  EXPECT_NE(std::string(nrtGetLastErrorMessage()).find("runs into device"), std::string::npos)
      << nrtGetLastErrorMessage();
  NRT_OK(nrtFree(d));
}
