// Config.cpp — parsing of the NEURON_RT_* environment variables.
#include "Config.h"

#include <cctype>
#include <cstdlib>
#include <thread>

namespace nrt {
namespace {

bool parseInt(const std::string& text, long lo, long hi, long* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

}  // namespace

bool parseBytes(const std::string& text, size_t* out) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  int shift = 0;
  std::string suffix(end);
  if (suffix == "" || suffix == "B") shift = 0;
  else if (suffix == "K" || suffix == "KB" || suffix == "KiB") shift = 10;
  else if (suffix == "M" || suffix == "MB" || suffix == "MiB") shift = 20;
  else if (suffix == "G" || suffix == "GB" || suffix == "GiB") shift = 30;
  else if (suffix == "T" || suffix == "TB" || suffix == "TiB") shift = 40;
  else return false;
  if (v > (~0ull >> shift)) return false;
  *out = static_cast<size_t>(v << shift);
  return true;
}

bool parseCoreList(const std::string& text, int numCores, std::vector<int>* out,
                   std::string* why) {
  std::vector<int> cores;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t dash = item.find('-');
    long a = 0, b = 0;
    bool ok = dash == std::string::npos
                  ? parseInt(item, 0, 1 << 20, &a) && (b = a, true)
                  : parseInt(item.substr(0, dash), 0, 1 << 20, &a) &&
                        parseInt(item.substr(dash + 1), 0, 1 << 20, &b) && a <= b;
    if (!ok) {
      *why = "'" + item + "' is not a core index or range like 0-3";
      return false;
    }
    for (long c = a; c <= b; ++c) {
      if (c >= numCores) {
        *why = "core " + std::to_string(c) + " does not exist (NEURON_RT_NUM_CORES=" +
               std::to_string(numCores) + ")";
        return false;
      }
      for (int seen : cores) {
        if (seen == c) {
          *why = "core " + std::to_string(c) + " is listed twice";
          return false;
        }
      }
      cores.push_back(static_cast<int>(c));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  *out = cores;
  return true;
}

Config readConfig() {
  Config c;
  unsigned hw = std::thread::hardware_concurrency();
  c.computeThreads = hw ? static_cast<int>(hw) : 1;
  auto bad = [&](const char* var, const std::string& why) {
    if (c.status != NRT_SUCCESS) return;  // keep the first problem
    c.status = NRT_ERROR_INVALID_CONFIG;
    c.error = std::string(var) + "=" + (env(var) ? env(var) : "") + ": " + why;
  };
  long v = 0;
  auto range = [](long lo, long hi) {
    return "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  };
  // Under a launcher that starts several processes per node (torchrun sets
  // LOCAL_WORLD_SIZE), each process picks core LOCAL_RANK, as each picks GPU
  // LOCAL_RANK on a CUDA node: the chip then has at least that many cores.
  // Not our variable: a value we cannot read is left to the launcher.
  if (const char* s = env("LOCAL_WORLD_SIZE")) {
    if (parseInt(s, 1, kMaxCores, &v) && v > c.numCores) c.numCores = static_cast<int>(v);
  }
  if (const char* s = env("NEURON_RT_NUM_CORES")) {
    if (parseInt(s, 0, kMaxCores, &v)) c.numCores = static_cast<int>(v);
    else bad("NEURON_RT_NUM_CORES", range(0, kMaxCores) + " (cores of the software chip)");
  }
  if (const char* s = env("NEURON_RT_MEMORY_PER_CORE")) {
    size_t bytes = 0;
    if (parseBytes(s, &bytes) && bytes >= kMinMemoryPerCore && bytes <= kMaxMemoryPerCore)
      c.memoryPerCore = bytes;
    else
      bad("NEURON_RT_MEMORY_PER_CORE",
          "expected a size from 64M to 1T (bytes, or with a K/M/G/T suffix, e.g. 512M or 8G)");
  }
  if (const char* s = env("NEURON_RT_EXECUTOR_THREADS")) {
    if (parseInt(s, 1, kMaxExecutorThreads, &v)) c.executorThreads = static_cast<int>(v);
    else bad("NEURON_RT_EXECUTOR_THREADS", range(1, kMaxExecutorThreads));
  }
  if (const char* s = env("NEURON_RT_COMPUTE_THREADS")) {
    if (parseInt(s, 1, kMaxComputeThreads, &v)) c.computeThreads = static_cast<int>(v);
    else bad("NEURON_RT_COMPUTE_THREADS", range(1, kMaxComputeThreads));
  }
  if (const char* s = env("NEURON_RT_QUEUE_DEPTH")) {
    if (parseInt(s, kMinQueueDepth, kMaxQueueDepth, &v)) c.queueDepth = v;
    else bad("NEURON_RT_QUEUE_DEPTH", range(kMinQueueDepth, kMaxQueueDepth));
  }
  if (const char* s = env("NEURON_LAUNCH_BLOCKING")) {
    std::string t(s);
    if (t == "1") c.launchBlocking = true;
    else if (t != "0") bad("NEURON_LAUNCH_BLOCKING", "expected 0 or 1");
  }
  for (int i = 0; i < c.numCores; ++i) c.visibleCores.push_back(i);
  if (const char* s = env("NEURON_RT_VISIBLE_CORES")) {
    std::string why;
    if (!parseCoreList(s, c.numCores, &c.visibleCores, &why)) bad("NEURON_RT_VISIBLE_CORES", why);
  }
  if (c.status != NRT_SUCCESS) c.visibleCores.clear();
  // Each local process starts on its own core, as AWS TorchNeuron's processes
  // each own one NeuronCore: tools written for it (accelerate) take
  // current_device() as the process's device without setting it. Scripts that
  // call set_device(LOCAL_RANK), the CUDA idiom, end up on the same core.
  if (const char* s = env("LOCAL_RANK")) {
    if (parseInt(s, 0, 1 << 20, &v) && !c.visibleCores.empty())
      c.initialDevice = static_cast<int>(v % static_cast<long>(c.visibleCores.size()));
  }
  return c;
}

}  // namespace nrt
