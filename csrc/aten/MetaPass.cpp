// MetaPass.cpp: see MetaPass.h.
#include "aten/MetaPass.h"

#include "aten/AsyncPath.h"
#include "aten/Common.h"

#include <ATen/EmptyTensor.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace torchneuron {

bool isResizeWarning(const c10::Warning& w) {
  static const std::string kResized = "An output with one or more elements was resized";
  return w.msg().compare(0, kResized.size(), kResized) == 0;
}

namespace {

struct MetaCache {
  static constexpr size_t kMaxEntries = 16384;
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<const MetaResult>> entries;
};
MetaCache& metaCache() {
  static auto* cache = new MetaCache();
  return *cache;
}

std::atomic<ForeignMetaRefusalTest> gForeignRefusalTest{nullptr};

bool isRefusal(std::exception_ptr error) {
  ForeignMetaRefusalTest test = gForeignRefusalTest.load(std::memory_order_acquire);
  return test == nullptr || test(error);
}

// The Meta stand-in of one argument.
c10::IValue metaArg(const c10::IValue& iv, bool generator) {
  auto toMeta = [](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || !isNeuron(t)) return t;  // undefined, or a CPU scalar
    return at::detail::empty_strided_meta(t.sizes(), t.strides(), t.scalar_type());
  };
  if (generator) return c10::IValue();
  if (iv.isDevice() && iv.toDevice().type() == kNeuron) return c10::Device(c10::DeviceType::Meta);
  return mapTensors(iv, toMeta);
}

// Runs the op on Meta tensors. Returns nullptr when the slow path must run
// (refused: the Meta kernel said it has no answer for the op).
std::shared_ptr<const MetaResult> runMeta(const c10::OperatorHandle& op, const Plan& plan,
                                          const torch::jit::Stack& stack, size_t begin,
                                          bool& refused) {
  const size_t n = plan.writtenArg.size();
  torch::jit::Stack meta;
  meta.reserve(n);
  std::vector<at::Tensor> writtenMeta;  // in the order prepare() saw them
  for (size_t i = 0; i < n; ++i) {
    meta.push_back(metaArg(stack[begin + i], plan.generatorArg[i]));
    if (!plan.writtenArg[i]) continue;
    forEachTensor(meta.back(), [&](const at::Tensor& t) {
      if (t.defined()) writtenMeta.push_back(t);
    });
  }
  // Held: given at the op only if the kernel is queued (the synchronous
  // path gives CPU's own warnings instead).
  struct Collect : c10::WarningHandler {
    std::vector<c10::Warning> warnings;
    void process(const c10::Warning& w) override { warnings.push_back(w); }
  } held;
  std::vector<std::vector<int64_t>> sizesBefore;  // of the written tensors
  for (const at::Tensor& w : writtenMeta) sizesBefore.push_back(w.sizes().vec());
  try {
    c10::WarningUtils::WarningHandlerGuard guard(&held);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const c10::NotImplementedError&) {
    refused = true;  // no Meta kernel, a data-dependent result, or a dtype it lacks
    return nullptr;
  } catch (const c10::Error&) {
    return nullptr;  // the slow path raises the CPU kernel's own error
  } catch (...) {
    // A Python meta kernel raised: it refused the op (data-dependent output,
    // e.g. nonzero), or it rejected these arguments as CPU's kernel will.
    refused = isRefusal(std::current_exception());
    return nullptr;
  }
  if (meta.size() != plan.returnArg.size()) return nullptr;
  auto result = std::make_shared<MetaResult>();
  result->warnings = std::move(held.warnings);
  bool resizedNonEmpty = false;
  for (size_t i = 0; i < writtenMeta.size(); ++i) {
    const auto& before = sizesBefore[i];
    resizedNonEmpty |= c10::multiply_integers(before) != 0 && writtenMeta[i].sizes().vec() != before;
  }
  result->resizeWarnedInPython =
      resizedNonEmpty &&
      std::none_of(result->warnings.begin(), result->warnings.end(), isResizeWarning);
  for (const at::Tensor& w : writtenMeta) result->written.emplace_back(w);
  for (size_t r = 0; r < plan.returnArg.size(); ++r) {
    if (plan.returnArg[r] >= 0) continue;
    if (!meta[r].isTensor()) return nullptr;
    if (meta[r].toTensor().defined()) {
      result->fresh.emplace_back(TensorMeta(meta[r].toTensor()));
    } else {
      // e.g. convolution_backward without grad_input
      result->fresh.emplace_back(std::nullopt);
      result->allFreshDefined = false;
    }
  }
  return result;
}

}  // namespace

// (ranNow: the Meta pass ran for this call, not taken from the cache.)
std::shared_ptr<const MetaResult> metaFor(const c10::OperatorHandle& op, const Plan& plan,
                                          const torch::jit::Stack& stack, size_t begin,
                                          const std::string& key, bool cacheable, bool& ranNow,
                                          bool& refused) {
  ranNow = false;
  refused = false;
  MetaCache& cache = metaCache();
  if (cacheable) {
    std::lock_guard<std::mutex> lk(cache.mu);
    auto it = cache.entries.find(key);
    if (it != cache.entries.end()) return it->second;
  }
  auto result = runMeta(op, plan, stack, begin, refused);
  ranNow = true;
  if (result && cacheable) {
    std::lock_guard<std::mutex> lk(cache.mu);
    if (cache.entries.size() >= MetaCache::kMaxEntries) cache.entries.clear();
    cache.entries.emplace(key, result);
  }
  return result;
}

void setForeignMetaRefusalTest(ForeignMetaRefusalTest test) {
  gForeignRefusalTest.store(test, std::memory_order_release);
}

void cacheMeta(const std::string& key, std::shared_ptr<const MetaResult> meta) {
  MetaCache& cache = metaCache();
  std::lock_guard<std::mutex> lk(cache.mu);
  cache.entries[key] = std::move(meta);
}

}  // namespace torchneuron
