// Config.h — the runtime's environment variables, read in this one place.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "neuron/runtime.h"

namespace nrt {

struct Config {
  int numCores = 2;
  std::vector<int> visibleCores;  // physical core of each visible device
  size_t memoryPerCore = size_t(8) << 30;
  int executorThreads = 2;
  int computeThreads = 1;
  bool launchBlocking = false;
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
