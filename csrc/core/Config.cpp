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

}  // namespace

const BackendConfig& backendConfig() {
  static const BackendConfig config = [] {
    BackendConfig c;
    c.async_path = readBool("TORCHNEURON_ASYNC", c.async_path);
    c.learned_layouts = readBool("TORCHNEURON_LEARNED_LAYOUTS", c.learned_layouts);
    c.fusion = readBool("TORCHNEURON_FUSION", c.fusion);
    c.list_loops = readBool("TORCHNEURON_LIST_LOOPS", c.list_loops);
    c.serial_kernels = readBool("TORCHNEURON_SERIAL_KERNELS", c.serial_kernels);
    c.flash_backward = readBool("TORCHNEURON_FLASH_BACKWARD", c.flash_backward);
    c.dist_check = readBool("TORCHNEURON_DIST_CHECK", c.dist_check);
    c.dist_shm = readBool("TORCHNEURON_DIST_SHM", c.dist_shm);
    return c;
  }();
  return config;
}

}  // namespace torchneuron
