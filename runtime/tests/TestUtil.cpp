#include "TestUtil.h"

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace {
std::mutex logMu;
std::vector<int> logData;
}  // namespace

nrtStatus sleepKernel(void* args) {
  std::this_thread::sleep_for(std::chrono::microseconds(static_cast<SleepArgs*>(args)->micros));
  return NRT_SUCCESS;
}

nrtStatus logKernel(void* args) {
  std::lock_guard<std::mutex> lk(logMu);
  logData.push_back(static_cast<LogArgs*>(args)->tag);
  return NRT_SUCCESS;
}

std::vector<int> takeLog() {
  std::lock_guard<std::mutex> lk(logMu);
  std::vector<int> out;
  out.swap(logData);
  return out;
}
