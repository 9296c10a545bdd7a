// SerialGemm.cpp — see SerialGemm.h.
#include "aten/SerialGemm.h"

#include "core/SerialCompute.h"

#include <omp.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace torchneuron {
namespace {

// What MKL's split can depend on.
struct Geometry {
  int transa, transb;  // ints only: no padding, compared and hashed as bytes
  int isDouble, betaZero, alphaOne;
  int m, n, k, lda, ldb, ldc;
  int alignA, alignB, alignC;  // address mod 64
  int threads;
  bool operator==(const Geometry& o) const { return std::memcmp(this, &o, sizeof(*this)) == 0; }
};

struct GeometryHash {
  size_t operator()(const Geometry& g) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the bytes
    const auto* p = reinterpret_cast<const unsigned char*>(&g);
    for (size_t i = 0; i < sizeof(g); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

std::atomic<uint64_t> gTried{0}, gAgreed{0};

int alignOf(const void* p) { return static_cast<int>(reinterpret_cast<uintptr_t>(p) % 64); }

Geometry geometryOf(const GemmCall& c, int threads) {
  Geometry g{};
  g.transa = c.transa;
  g.transb = c.transb;
  g.isDouble = c.isDouble;
  g.betaZero = c.beta == 0;
  g.alphaOne = c.alpha == 1;
  g.m = c.m, g.n = c.n, g.k = c.k;
  g.lda = c.lda, g.ldb = c.ldb, g.ldc = c.ldc;
  g.alignA = alignOf(c.a), g.alignB = alignOf(c.b), g.alignC = alignOf(c.c);
  g.threads = threads;
  return g;
}

// Memory of `elements` values starting at address offset `align` mod 64,
// filled with values whose sums depend on their order.
struct Operand {
  std::vector<unsigned char> bytes;
  void* data = nullptr;
  Operand(int64_t elements, size_t width, int align, uint64_t seed) {
    bytes.resize(static_cast<size_t>(elements) * width + 128);
    const uintptr_t base = reinterpret_cast<uintptr_t>(bytes.data());
    data = bytes.data() + ((64 - base % 64) % 64) + align;
    uint64_t x = seed;
    for (int64_t i = 0; i < elements; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      // A value in (-2, 2) with a full mantissa.
      const double v = (static_cast<double>(x >> 11) / 9007199254740992.0) * 4.0 - 2.0;
      if (width == sizeof(double)) {
        static_cast<double*>(data)[i] = v;
      } else {
        static_cast<float*>(data)[i] = static_cast<float>(v);
      }
    }
  }
};

bool tryGeometry(const GemmCall& call) {
  const size_t width = call.isDouble ? sizeof(double) : sizeof(float);
  // Column-major: an operand's leading dimension times its column count.
  const int64_t aCols = call.transa == 'n' || call.transa == 'N' ? call.k : call.m;
  const int64_t bCols = call.transb == 'n' || call.transb == 'N' ? call.n : call.k;
  const Operand a(int64_t(call.lda) * aCols, width, alignOf(call.a), 1);
  const Operand b(int64_t(call.ldb) * bCols, width, alignOf(call.b), 2);
  Operand many(int64_t(call.ldc) * call.n, width, alignOf(call.c), 3);
  Operand one(int64_t(call.ldc) * call.n, width, alignOf(call.c), 3);
  callBlas(call, a.data, b.data, many.data);
  {
    SerialScope serial(true, SerialScope::Kind::kTrial);
    if (!serial.active()) return false;
    callBlas(call, a.data, b.data, one.data);
  }
  return std::memcmp(many.data, one.data, static_cast<size_t>(call.ldc) * call.n * width) == 0;
}

// The verdict of `key`, tried with `attempt` on its first use in the
// process. Each executor thread keeps the verdicts it has used, so its
// later calls take no lock; the process-wide map keeps a geometry from being
// tried again by every executor thread that meets it (each trial is a
// parallel run that wakes the team, whenever a thread first meets it).
template <class Key, class Hash, class Try>
bool verdictFor(const Key& key, Try&& attempt) {
  thread_local std::unordered_map<Key, bool, Hash> local;
  const auto hit = local.find(key);
  if (hit != local.end()) return hit->second;
  static std::mutex mu;
  static auto* shared = new std::unordered_map<Key, bool, Hash>();  // used until exit
  {
    std::lock_guard<std::mutex> lk(mu);
    const auto it = shared->find(key);
    if (it != shared->end()) return local.emplace(key, it->second).first->second;
  }
  // Tried outside the lock: another thread meeting the same geometry
  // meanwhile tries it too, and finds the same verdict.
  const bool agrees = attempt();
  gTried.fetch_add(1, std::memory_order_relaxed);
  if (agrees) gAgreed.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lk(mu);
    shared->emplace(key, agrees);
  }
  local.emplace(key, agrees);
  return agrees;
}

// The executing thread's count, when it may try a geometry (0: it may not).
int trialThreads() {
  if (serialReference() != 0 || omp_in_parallel()) return 0;
  const int threads = omp_get_max_threads();
  return threads > 1 ? threads : 0;
}

}  // namespace

bool serialGemmAgrees(const GemmCall& call) {
  const int threads = trialThreads();
  if (threads == 0) return false;
  return verdictFor<Geometry, GeometryHash>(geometryOf(call, threads),
                                            [&] { return tryGeometry(call); });
}

SerialGemmStats serialGemmStats() {
  return {gTried.load(std::memory_order_relaxed), gAgreed.load(std::memory_order_relaxed)};
}

}  // namespace torchneuron
