// Config.h — the runtime's environment variables, read in this one place.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "neuron/runtime.h"

namespace nrt {

// Valid ranges (documented in neuron/runtime.h and the README). A device
// index must fit PyTorch's c10::DeviceIndex (int8_t) and each core reserves
// its arena's address space and starts its own threads, so the core count
// is kept well inside both; the arena must hold at least the caching
// allocators' segments (2 MiB small, 20 MiB mid-size) with room to spare,
// and 64 arenas of the largest size still fit the 47-bit user address space.
constexpr int kMaxCores = 64;
constexpr size_t kMinMemoryPerCore = size_t(64) << 20;  // 64M
constexpr size_t kMaxMemoryPerCore = size_t(1) << 40;   // 1T
constexpr int kMaxExecutorThreads = 64;
constexpr int kMaxComputeThreads = 1024;
// Work items a stream may hold queued before a launch waits: each costs host
// memory (its task and arguments) until it runs.
constexpr long kMinQueueDepth = 64;
constexpr long kMaxQueueDepth = long(1) << 24;

struct Config {
  int numCores = 2;
  std::vector<int> visibleCores;  // physical core of each visible device
  size_t memoryPerCore = size_t(8) << 30;
  int executorThreads = 2;
  int computeThreads = 1;
  long queueDepth = 16384;  // per stream (NEURON_RT_QUEUE_DEPTH)
  bool launchBlocking = false;
  // Every thread's current device until it sets one: LOCAL_RANK under a
  // launcher (modulo the visible devices), else 0.
  int initialDevice = 0;
  nrtStatus status = NRT_SUCCESS;  // INVALID_CONFIG when a variable is malformed
  std::string error;               // which variable, and why
};

// Parses the environment (the variables are listed in neuron/runtime.h).
Config readConfig();

// Exposed for tests: parses "0,2-3" into core indices below numCores.
bool parseCoreList(const std::string& text, int numCores, std::vector<int>* out,
                   std::string* why);
// Exposed for tests: parses "512", "64K", "8G" into bytes.
bool parseBytes(const std::string& text, size_t* out);

}  // namespace nrt
