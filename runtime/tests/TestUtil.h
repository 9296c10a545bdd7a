// TestUtil.h — helpers shared by the runtime suites.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "neuron/runtime.h"

// Asserts a call succeeds, printing the runtime's message otherwise.
#define NRT_OK(call) ASSERT_EQ((call), NRT_SUCCESS) << nrtGetLastErrorMessage()
#define NRT_EXPECT_OK(call) EXPECT_EQ((call), NRT_SUCCESS) << nrtGetLastErrorMessage()

inline bool launchBlocking() {
  const char* v = std::getenv("NEURON_LAUNCH_BLOCKING");
  return v && std::string(v) == "1";
}

// The arena capacity this process was configured with (ctest sets
// NEURON_RT_MEMORY_PER_CORE=256M; the runtime's default is 8G).
inline size_t expectedCapacity() {
  const char* v = std::getenv("NEURON_RT_MEMORY_PER_CORE");
  if (v && std::string(v) == "256M") return size_t(256) << 20;
  return size_t(8) << 30;
}

inline nrtStream_t defaultStream(int device = 0) {
  nrtStream_t s = 0;
  EXPECT_EQ(nrtStreamGetDefault(&s, device), NRT_SUCCESS);
  return s;
}

// A kernel that sleeps, so that tests can observe pending work.
struct SleepArgs {
  int micros;
};
nrtStatus sleepKernel(void* args);

// A kernel that appends its tag to a shared log (thread-safe).
struct LogArgs {
  int tag;
};
nrtStatus logKernel(void* args);
std::vector<int> takeLog();
