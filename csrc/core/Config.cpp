#include "core/Config.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace torchneuron {
namespace {

bool readBool(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  if (std::strcmp(v, "1") == 0) return true;
  if (std::strcmp(v, "0") == 0) return false;
  TORCH_WARN(name, "=", v, " is not 0 or 1; using ", fallback ? 1 : 0);
  return fallback;
}

int64_t readInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  char* end = nullptr;
  const long long parsed = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0' || parsed < 0) {
    TORCH_WARN(name, "=", v, " is not a non-negative integer; using ", fallback);
    return fallback;
  }
  return parsed;
}

}  // namespace

const BackendConfig& backendConfig() {
  static const BackendConfig config = [] {
    BackendConfig c;
    c.generic_async = readBool("TORCHNEURON_GENERIC_ASYNC", c.generic_async);
    c.generic_async_min_numel =
        readInt("TORCHNEURON_GENERIC_ASYNC_MIN_NUMEL", c.generic_async_min_numel);
    return c;
  }();
  return config;
}

}  // namespace torchneuron
