// ArenaTest.cpp — the device arena's sub-allocator on its own.
#include <vector>

#include "Arena.h"
#include "TestUtil.h"

using nrt::Arena;

TEST(Arena, AllocatesAlignedWithinCapacity) {
  Arena a(1 << 20);
  ASSERT_TRUE(a.ok());
  void* p = a.allocate(1);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % Arena::kAlignment, 0u);
  EXPECT_TRUE(a.contains(p));
  EXPECT_EQ(a.used(), Arena::kAlignment);
  EXPECT_TRUE(a.release(p));
  EXPECT_EQ(a.used(), 0u);
}

TEST(Arena, ExactCapacityThenFull) {
  Arena a(1 << 20);
  void* all = a.allocate(1 << 20);
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(a.allocate(1), nullptr);
  EXPECT_TRUE(a.release(all));
  EXPECT_EQ(a.allocate((1 << 20) + 1), nullptr);
}

TEST(Arena, CoalescesFreedNeighbours) {
  Arena a(4096);
  std::vector<void*> ps;
  for (int i = 0; i < 16; ++i) ps.push_back(a.allocate(256));
  for (void* p : ps) ASSERT_NE(p, nullptr);
  EXPECT_EQ(a.allocate(256), nullptr);
  // Free in an order that needs merging on both sides.
  for (int i : {1, 3, 2, 0, 5, 4, 7, 6, 9, 8, 11, 10, 13, 15, 12, 14}) EXPECT_TRUE(a.release(ps[i]));
  EXPECT_EQ(a.largestFree(), 4096u);
  EXPECT_NE(a.allocate(4096), nullptr);
}

TEST(Arena, FindsInteriorPointersOnly) {
  Arena a(1 << 16);
  char* p = static_cast<char*>(a.allocate(1000));
  void* base;
  size_t size;
  ASSERT_TRUE(a.find(p + 999, &base, &size));
  EXPECT_EQ(base, p);
  EXPECT_EQ(size, 1024u);  // rounded to the alignment
  EXPECT_FALSE(a.find(p + 1024, &base, &size));
  EXPECT_FALSE(a.release(p + 8));
  EXPECT_TRUE(a.release(p));
  EXPECT_FALSE(a.release(p));
  EXPECT_FALSE(a.find(p, &base, &size));
}
