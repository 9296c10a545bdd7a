#include "aten/AsyncGeneric.h"

#include "aten/Common.h"
#include "aten/Launch.h"
#include "core/Config.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty_strided.h>

#include <algorithm>
#include <atomic>

namespace torchneuron {
namespace {

std::atomic<bool>& enabledFlag() {
  static std::atomic<bool> flag(backendConfig().generic_async);
  return flag;
}

// Below this many written elements the synchronous path is cheaper: the
// Meta validation costs tens of microseconds or more (many Meta kernels are
// Python).
int64_t minNumel() { return backendConfig().generic_async_min_numel; }

bool isWrite(const c10::Argument& a) {
  return a.alias_info() != nullptr && a.alias_info()->isWrite();
}

// Every return aliases a written argument (in-place / out= ops) and is a
// tensor or tensor list; at least one argument is written.
bool schemaEligible(const c10::FunctionSchema& schema) {
  bool any_written = false;
  for (const auto& a : schema.arguments()) any_written |= isWrite(a);
  if (!any_written) return false;
  for (const auto& r : schema.returns()) {
    if (!isWrite(r)) return false;
  }
  return true;
}

// Index of the argument a return aliases, or -1.
int aliasedArgument(const c10::FunctionSchema& schema, const c10::Argument& ret) {
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (isWrite(args[i]) && args[i].alias_info()->beforeSets() == ret.alias_info()->beforeSets()) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

at::Tensor metaLike(const at::Tensor& alias) {
  at::Tensor m = at::empty_strided(alias.sizes(), alias.strides(),
                                   alias.options().device(c10::kMeta));
  m._set_conj(alias.is_conj());
  m._set_neg(alias.is_neg());
  return m;
}

bool sameGeometry(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.strides() == b.strides();
}

}  // namespace

bool genericAsyncEnabled() { return enabledFlag().load(std::memory_order_relaxed); }
void setGenericAsyncEnabled(bool enabled) { enabledFlag().store(enabled); }

bool tryEnqueueGeneric(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t begin,
                       const std::vector<c10::IValue>& originals, c10::DeviceIndex device,
                       const char* name) {
  if (!genericAsyncEnabled()) return false;
  const auto& schema = op.schema();
  if (!schemaEligible(schema)) return false;
  const auto& arguments = schema.arguments();
  const size_t n = arguments.size();
  int64_t written_numel = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!isWrite(arguments[i])) continue;
    const c10::IValue& orig = originals[i];
    if (orig.isTensor() && orig.toTensor().defined()) {
      written_numel += orig.toTensor().numel();
    } else if (orig.isTensorList()) {
      for (const at::Tensor& t : orig.toTensorList()) written_numel += t.numel();
    }
  }
  if (written_numel < minNumel()) return false;

  // Meta arguments: neuron tensors become meta tensors of the same geometry.
  torch::jit::Stack meta_stack;
  meta_stack.reserve(n);
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // (alias, meta)
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& conv = (*stack)[begin + i];
    const c10::IValue& orig = originals[i];
    const bool w = isWrite(arguments[i]);
    if (orig.isTensor()) {
      if (isNeuron(orig.toTensor())) {
        at::Tensor m = metaLike(conv.toTensor());
        if (w) written.emplace_back(conv.toTensor(), m);
        meta_stack.emplace_back(std::move(m));
      } else {
        meta_stack.push_back(conv);  // undefined or a CPU scalar
      }
    } else if (orig.isTensorList()) {
      auto olist = orig.toTensorList();
      auto clist = conv.toTensorList();
      c10::List<at::Tensor> mlist;
      mlist.reserve(clist.size());
      for (size_t j = 0; j < clist.size(); ++j) {
        const at::Tensor& o = olist.get(j);
        if (!isNeuron(o)) {
          if (o.defined() && o.dim() != 0) return false;
          mlist.push_back(clist.get(j));
          continue;
        }
        at::Tensor m = metaLike(clist.get(j));
        if (w) written.emplace_back(clist.get(j), m);
        mlist.push_back(m);
      }
      meta_stack.emplace_back(std::move(mlist));
    } else if (orig.isOptionalTensorList()) {
      return false;  // indexing ops: host-side index handling, keep synchronous
    } else if (orig.isDevice() || orig.isGenerator()) {
      // Generators: the CPU generator was derived already; Meta ignores it.
      meta_stack.push_back(conv);
    } else {
      meta_stack.push_back(conv);
    }
  }
  if (written.empty()) return false;

  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta_stack);
  } catch (const std::exception&) {
    return false;  // no Meta kernel, or an error the synchronous path will raise
  }
  for (const auto& [alias, meta] : written) {
    if (!sameGeometry(alias, meta)) return false;  // the kernel would resize an output
  }

  // Queue the CPU kernel over the aliases; the closure owns no device memory.
  // CPU scalar tensors are snapshotted: their value at launch time counts.
  std::vector<c10::IValue> args((*stack).begin() + static_cast<std::ptrdiff_t>(begin),
                                (*stack).end());
  for (size_t i = 0; i < n; ++i) {
    if (!originals[i].isTensor()) continue;
    const at::Tensor& o = originals[i].toTensor();
    if (o.defined() && o.device().is_cpu() && !o.unsafeGetTensorImpl()->is_wrapped_number()) {
      args[i] = o.clone();
    }
  }

  launchOnStream(getCurrentStream(device), name, [op, args = std::move(args)]() mutable {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    torch::jit::Stack s(std::make_move_iterator(args.begin()), std::make_move_iterator(args.end()));
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &s);
  });

  // Returns: the original (device) arguments they alias.
  std::vector<c10::IValue> returns;
  for (const auto& ret : schema.returns()) {
    const int idx = aliasedArgument(schema, ret);
    TORCH_INTERNAL_ASSERT(idx >= 0, "neuron: return of ", schema.name(), " aliases no argument");
    returns.push_back(originals[idx]);
  }
  torch::jit::drop(*stack, n);
  for (auto& r : returns) torch::jit::push(*stack, std::move(r));
  return true;
}

}  // namespace torchneuron
