// FenceTest.cpp — the asymmetric fence that the stream hand-off relies on
// (Fence.h), as a store-buffering litmus test.
#include <atomic>
#include <thread>
#include <vector>
#include <cstdio>
#include <functional>

#include <gtest/gtest.h>

#include "../src/Fence.h"

namespace {

// Two threads each store to one flag and then read the other's, in rounds
// that both start at once (the helper after it sees the round begin, the
// test thread after a random delay that covers the helper's lag, so that
// some rounds' stores land together): `fenced` puts lightFence() between
// the store and the load on the helper's side and heavyFence() on the test
// thread's, as Executor::enqueue and Executor::releaseLocked do. Returns the
// rounds in which both reads missed the other's store (in the executor: a
// launch left in the inbox of a stream that no worker owns). Spins: two
// threads on two cores.
int bothMissed(int rounds, bool fenced) {
  std::atomic<int> x{0}, y{0};
  std::atomic<int> round{-1}, done{-1};
  std::vector<int> seenByLight(rounds);
  std::thread light([&] {
    for (int r = 0; r < rounds; ++r) {
      while (round.load(std::memory_order_acquire) != r) {
      }
      x.store(1, std::memory_order_relaxed);
      if (fenced) nrt::lightFence();
      seenByLight[r] = y.load(std::memory_order_relaxed);
      done.store(r, std::memory_order_release);
    }
  });
  int missed = 0;
  unsigned seed = 12345;
  for (int r = 0; r < rounds; ++r) {
    x.store(0, std::memory_order_relaxed);
    y.store(0, std::memory_order_relaxed);
    round.store(r, std::memory_order_release);
    seed = seed * 1103515245u + 12345u;
    for (volatile unsigned d = (seed >> 16) % 256; d > 0; d = d - 1) {
    }
    y.store(1, std::memory_order_relaxed);
    if (fenced) nrt::heavyFence();
    const int seenByHeavy = x.load(std::memory_order_relaxed);
    while (done.load(std::memory_order_acquire) != r) {
    }
    if (seenByLight[r] == 0 && seenByHeavy == 0) ++missed;
  }
  light.join();
  return missed;
}

}  // namespace

TEST(Fence, OneSideAlwaysSeesTheOther) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two cores to race";
  constexpr int kRounds = 20000;
  // Without fences the same rounds do miss on x86 (stores wait in the store
  // buffer while the later load goes ahead): the control shows whether this
  // machine exercises the case at all.
  const int unfenced = bothMissed(kRounds, /*fenced=*/false);
  EXPECT_EQ(bothMissed(kRounds, /*fenced=*/true), 0)
      << "asymmetric fence " << (nrt::asymmetricFenceAvailable() ? "(membarrier)" : "(full fences)")
      << " let both sides miss; without fences " << unfenced << " of " << kRounds << " rounds did";
  if (unfenced == 0) {
    std::printf("note: no reordering without fences in %d rounds on this machine\n", kRounds);
  }
}
