// The generic path: any op without a dedicated neuron kernel runs its CPU
// kernel directly on device memory.
//
//   1. find the op's device (neuron tensor arguments or a Device argument) and
//      check that all non-scalar tensors are on it;
//   2. wait for the device's current stream (the generic path is synchronous);
//   3. replace each neuron tensor by a CPU tensor aliasing the same memory
//      (same sizes, strides, storage offset; tensors sharing a storage share
//      one alias storage), a neuron Device argument by CPU, and a neuron
//      Generator (or the device's default one) by a CPU generator derived
//      from the Philox seed and offset;
//   4. run the CPU kernel;
//   5. map results back: in-place/out results are the original device
//      tensors (resized on the device when the kernel resized them), results
//      that view an input alias become device views of the same storage, and
//      fresh results are copied into new device tensors.
// Fresh outputs are zero-copy: host allocations made by the CPU kernel on
// this thread are redirected to the device caching allocator while it runs
// (AllocationRedirect.h), and the generic path adopts them as device storage.
// Outputs allocated elsewhere (another thread, a foreign allocator) are
// copied; freshOutputCopies() counts those copies.
#include "aten/Common.h"
#include "core/HostWait.h"
#include "aten/AsyncPath.h"
#include "aten/OpPlan.h"

#include "aten/AllocationRedirect.h"
#include "core/Generator.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/op_registration.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/flat_hash_map.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

namespace torchneuron {
namespace {

// The synchronous path's state. Every call builds one before it tries the
// asynchronous path, which uses only `device` and `counters`: the maps are
// std::unordered_map, which allocates nothing until its first insert (ska's
// flat map allocates a table as it is built: five mallocs and frees per
// queued op for maps it never touched).
struct AliasState {
  c10::DeviceIndex device = -1;
  OpCounters* counters = nullptr;  // the op's, for the copies it costs
  // device StorageImpl -> CPU alias storage (and back)
  std::unordered_map<c10::StorageImpl*, c10::Storage> to_cpu;
  std::unordered_map<c10::StorageImpl*, at::Tensor> to_device;  // a device tensor over it
  // CPU alias TensorImpl -> original device tensor
  std::unordered_map<c10::TensorImpl*, at::Tensor> originals;
  // device TensorImpl -> its one CPU alias: a tensor passed twice (x.op_(x),
  // op(x, out=x)) is one tensor to the kernel too, as on CPU, where kernels
  // tell in-place from out-of-place by identity (e.g. TensorIterator refuses
  // to resize an output that is also an input)
  std::unordered_map<c10::TensorImpl*, at::Tensor> by_impl;
  // mutable (written) tensor arguments: (original device tensor, alias)
  std::vector<std::pair<at::Tensor, at::Tensor>> written;
  // fresh CPU storages whose memory came from the device (redirect) -> the
  // device storage that adopted it
  std::unordered_map<c10::StorageImpl*, c10::Storage> adopted;
};

// Moves a redirected (device-memory) DataPtr out of a CPU storage.
c10::DataPtr takeDeviceData(c10::StorageImpl* cpu_storage, c10::DeviceIndex device) {
  c10::DataPtr dp = cpu_storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
  cpu_storage->set_nbytes(0);
  dp.unsafe_set_device(c10::Device(kNeuron, device));
  return dp;
}

// Name and counters of an operator, cached by its schema's address.
struct OpInfo {
  std::string name;
  OpCounters* counters;
  bool dataDependent;  // its output shape depends on its input values
};

// Ops whose result shape depends on data: the host must wait for the device
// by nature (CUDA's kernels for them synchronize too).
bool shapeDependsOnData(const std::string& name) {
  static const char* const kOps[] = {
      "aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique",
      "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
      "aten::unique_dim_consecutive", "aten::repeat_interleave", "aten::bincount",
      "aten::argwhere", "aten::nonzero_numpy", "aten::index", "aten::_assert_async",
      "aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal", "aten::allclose"};
  const std::string base = name.substr(0, name.find('.'));
  for (const char* op : kOps)
    if (base == op) return true;
  return false;
}

const OpInfo& opInfo(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static auto* cache = new ska::flat_hash_map<const void*, std::unique_ptr<OpInfo>>();
  const void* key = &op.schema();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*cache)[key];
  if (!slot) {
    std::string name = fullName(op.schema().operator_name());
    OpCounters* counters = opCounters(name);
    const bool dataDependent = shapeDependsOnData(name);
    slot = std::make_unique<OpInfo>(OpInfo{std::move(name), counters, dataDependent});
  }
  return *slot;
}

std::atomic<int64_t> g_fresh_output_copies{0};

[[noreturn]] void deviceMismatch(const std::string& op, c10::Device a, c10::Device b) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two "
                     "devices, ", a, " and ", b, "! (while running ", op, " on neuron)");
}

void noteDevice(AliasState& st, const std::string& op, c10::Device d) {
  if (st.device < 0) {
    st.device = d.index();
  } else if (st.device != d.index()) {
    deviceMismatch(op, c10::Device(kNeuron, st.device), d);
  }
}

at::Tensor aliasOf(AliasState& st, const at::Tensor& t, bool written) {
  auto seen = st.by_impl.find(t.unsafeGetTensorImpl());
  if (seen != st.by_impl.end()) {
    if (written) noteWritten(st.written, t, seen->second);
    return seen->second;
  }
  auto* impl = t.storage().unsafeGetStorageImpl();
  auto it = st.to_cpu.find(impl);
  if (it == st.to_cpu.end()) {
    c10::Storage alias = cpuStorageAlias(t.storage(), /*resizable=*/true);
    st.to_device.emplace(alias.unsafeGetStorageImpl(), t);
    it = st.to_cpu.emplace(impl, std::move(alias)).first;
  }
  at::Tensor cpu = tensorOverStorage(it->second, t, c10::DispatchKey::CPU);
  st.originals.emplace(cpu.unsafeGetTensorImpl(), t);
  st.by_impl.emplace(t.unsafeGetTensorImpl(), cpu);
  if (written) noteWritten(st.written, t, cpu);
  return cpu;
}

// Maps one CPU result back to the device.
at::Tensor resultToDevice(AliasState& st, const at::Tensor& r, const std::string& op) {
  if (!r.defined() || !r.device().is_cpu()) return r;
  TORCH_CHECK_NOT_IMPLEMENTED(
      !r.is_nested(), op, " returned a nested tensor: nested tensors are not supported on "
      "neuron yet. (nn.TransformerEncoder makes them in its inference fast path when given a "
      "src_key_padding_mask; pass enable_nested_tensor=False to the encoder.)");
  if (r.layout() == at::kSparse) {
    // Sparse COO (e.g. _to_sparse of a dense tensor): indices and values
    // come back like any result, under a sparse neuron tensor (Sparse.cpp).
    return at::_sparse_coo_tensor_with_dims_and_tensors(
        r.sparse_dim(), r.dense_dim(), r.sizes(), resultToDevice(st, r._indices(), op),
        resultToDevice(st, r._values(), op), r.options().device(kNeuron, st.device),
        r.is_coalesced());
  }
  TORCH_CHECK_NOT_IMPLEMENTED(
      r.layout() == at::kStrided, op, " returned a ", r.layout(),
      " tensor: neuron supports the strided and sparse COO layouts only (no sparse "
      "compressed or mkldnn tensors yet). Make the tensor on CPU instead, e.g. "
      "x.cpu().to_sparse_csr().");
  auto orig = st.originals.find(r.unsafeGetTensorImpl());
  if (orig != st.originals.end()) return orig->second;
  if (r.has_storage()) {
    auto* simpl = r.storage().unsafeGetStorageImpl();
    auto dev = st.to_device.find(simpl);
    if (dev != st.to_device.end()) {
      // A view of an input: same storage on the device.
      return viewOf(dev->second, r);
    }
    auto adopted = st.adopted.find(simpl);
    if (adopted == st.adopted.end() && isDeviceDataPtr(simpl->data_ptr())) {
      // A fresh output the kernel wrote straight into device memory: adopt
      // it as device storage (zero-copy).
      const size_t nbytes = simpl->nbytes();
      c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                           takeDeviceData(simpl, st.device), getDeviceAllocator(),
                           /*resizable=*/true);
      adopted = st.adopted.emplace(simpl, std::move(storage)).first;
    }
    if (adopted != st.adopted.end()) {
      return tensorOverStorage(adopted->second, r, c10::DispatchKey::PrivateUse1);
    }
  }
  recordFreshOutputCopy(st.counters);
  return copyToDevice(r, st.device);
}

// Brings a written argument back in sync with what the kernel did to its alias.
void syncWritten(AliasState& st, const at::Tensor& original, const at::Tensor& alias) {
  auto* oimpl = original.unsafeGetTensorImpl();
  auto* aimpl = alias.unsafeGetTensorImpl();
  const bool same_storage =
      alias.storage().unsafeGetStorageImpl() ==
          st.to_cpu[original.storage().unsafeGetStorageImpl()].unsafeGetStorageImpl() &&
      alias.storage().data() == original.storage().data();
  if (same_storage) {
    if (oimpl->sizes() != aimpl->sizes() || oimpl->strides() != aimpl->strides() ||
        oimpl->storage_offset() != aimpl->storage_offset()) {
      oimpl->set_sizes_and_strides(aimpl->sizes(), aimpl->strides(), aimpl->storage_offset());
    }
    // Some kernels flip the bits of their out= tensor (linalg_lu_solve with
    // left=False leaves it a conjugate view): the device tensor follows.
    if (original.is_conj() != alias.is_conj()) original._set_conj(alias.is_conj());
    if (original.is_neg() != alias.is_neg()) original._set_neg(alias.is_neg());
    return;
  }
  auto* alias_storage = alias.storage().unsafeGetStorageImpl();
  if (alias_storage == st.to_cpu[original.storage().unsafeGetStorageImpl()].unsafeGetStorageImpl() &&
      isDeviceDataPtr(alias_storage->data_ptr())) {
    // The kernel grew the storage in place and the new bytes are device
    // memory (redirect): the device storage adopts them, like the CPU
    // storage did; every view of it sees the new data.
    auto* device_storage = original.storage().unsafeGetStorageImpl();
    const size_t nbytes = alias_storage->nbytes();
    device_storage->set_data_ptr_noswap(takeDeviceData(alias_storage, st.device));
    device_storage->set_nbytes(nbytes);
    oimpl->set_sizes_and_strides(aimpl->sizes(), aimpl->strides(), aimpl->storage_offset());
    return;
  }
  // The kernel moved the alias elsewhere: resize the device tensor and copy.
  recordFreshOutputCopy(st.counters);
  original.resize_(alias.sizes());
  if (original.strides() != alias.strides() && alias.is_non_overlapping_and_dense()) {
    oimpl->set_sizes_and_strides(aimpl->sizes(), aimpl->strides(), oimpl->storage_offset());
    const size_t needed = at::detail::computeStorageNbytes(
        oimpl->sizes(), oimpl->strides(), oimpl->dtype().itemsize(), oimpl->storage_offset());
    if (needed > original.storage().nbytes()) resizeStorageBytes(original.storage(), needed);
  }
  original.copy_(alias);
}

}  // namespace

void genericFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  runGeneric(op, stack, nullptr, {});
}

namespace {
// The Meta pass's Python kernel already told the user that an out= tensor
// was resized (AsyncPath.h): CPU's kernel's words for it are not repeated;
// every other warning goes on to the handler that was in place.
struct SkipResizeWarnings : c10::WarningHandler {
  c10::WarningHandler* next = c10::WarningUtils::get_warning_handler();
  void process(const c10::Warning& w) override {
    if (!isResizeWarning(w)) next->process(w);
  }
};
}  // namespace

void runGeneric(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                const c10::OperatorHandle* target, const StackAdjust& adjust) {
  const auto& schema = op.schema();
  const OpInfo& info = opInfo(op);
  const std::string& name = info.name;

  const auto& arguments = schema.arguments();
  const size_t num_args = arguments.size();
  const size_t begin = stack->size() - num_args;

  AliasState st;
  st.counters = info.counters;
  // Pass 1: the device.
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& iv = (*stack)[begin + i];
    forEachTensor(iv, [&](const at::Tensor& t) {
      if (isNeuron(t)) noteDevice(st, name, t.device());
    });
    if (iv.isDevice() && iv.toDevice().type() == kNeuron) {
      noteDevice(st, name, c10::Device(kNeuron, resolveDevice(iv.toDevice().index())));
    }
  }
  if (st.device < 0) {
    // Dispatched here without a neuron tensor or device (e.g. a generator).
    st.device = currentDevice();
  }
  c10::DeviceGuard guard(c10::Device(kNeuron, st.device));
  lazyInit();

  // Most ops can run asynchronously in stream order; the rest run here.
  AsyncVerify verify;
  if (target == nullptr && tryAsyncPath(op, stack, st.device, &verify)) return;
  std::optional<SkipResizeWarnings> skipResize;
  std::optional<c10::WarningUtils::WarningHandlerGuard> skipResizeGuard;
  if (verify.resizeWarned) {
    skipResize.emplace();
    skipResizeGuard.emplace(&*skipResize);
  }

  // Written tensors materialize a copy-on-write storage before their alias
  // is made (the alias writes the device bytes directly); read ones do not
  // (cpuStorageAlias takes the bytes without materializing), as on CPU.
  for (size_t i = 0; i < num_args; ++i) {
    const auto* ai = arguments[i].alias_info();
    if (ai == nullptr || !ai->isWrite()) continue;
    forEachTensor((*stack)[begin + i], [](const at::Tensor& t) {
      if (isNeuron(t) && t.has_storage()) (void)t.mutable_data_ptr();
    });
  }

  // Pass 2: replace arguments.
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& iv = (*stack)[begin + i];
    const auto& arg = arguments[i];
    const bool written = arg.alias_info() != nullptr && arg.alias_info()->isWrite();
    const bool hostValues = readOnHost(op.schema(), i);
    auto convert = [&](const at::Tensor& t) -> at::Tensor {
      if (!t.defined()) return t;
      if (isNeuron(t)) return aliasOf(st, t, written);
      // A CPU scalar mixes with device tensors (as on CUDA), but nothing is
      // written to CPU memory: a CPU out= tensor is a device mismatch.
      if (t.device().is_cpu() && ((t.dim() != 0 && !hostValues) || written) &&
          !iv.isOptionalTensorList()) {
        deviceMismatch(name, c10::Device(kNeuron, st.device), t.device());
      }
      return t;
    };
    if (iv.isTensor() || iv.isTensorList() || iv.isOptionalTensorList()) {
      iv = mapTensors(iv, convert);
    } else if (iv.isDevice() && iv.toDevice().type() == kNeuron) {
      iv = c10::Device(c10::DeviceType::CPU);
    } else if (isKindOrOptional(arg.type(), c10::TypeKind::GeneratorType)) {
      at::Generator gen = iv.isNone() ? getDefaultGenerator(st.device) : iv.toGenerator();
      checkNeuronGenerator(gen);
      iv = gen.get<NeuronGeneratorImpl>()->deriveCpuGenerator();
    }
  }

  recordOp(info.counters, OpPath::Fallback);

  // Synchronous: queued work on the current stream must finish before the
  // host touches the memory (unless the call touches none).
  if (info.dataDependent) {
    noteHostWait(WaitCause::DataDependent, info.name);
    getCurrentStream(st.device).synchronize();
  } else if (!verify.touchesNoData) {
    noteHostWait(WaitCause::SyncPath, verify.refusal ? info.name + " (" + verify.refusal + ")"
                                                     : info.name);
    getCurrentStream(st.device).synchronize();
  }

  {
    AllocationRedirectGuard redirect(st.device);
    if (target != nullptr) {
      if (adjust) adjust(*stack, begin);
      target->callBoxed(stack);
    } else {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    }
  }

  for (auto& [original, alias] : st.written) {
    syncWritten(st, original, alias);
  }
  verify.finish();
  const size_t num_returns = schema.returns().size();
  const size_t rbegin = stack->size() - num_returns;
  for (size_t i = 0; i < num_returns; ++i) {
    c10::IValue& iv = (*stack)[rbegin + i];
    iv = mapTensors(iv, [&](const at::Tensor& t) { return resultToDevice(st, t, name); });
  }
}

int64_t freshOutputCopies() { return g_fresh_output_copies.load(); }
void recordFreshOutputCopy(OpCounters* op) {
  g_fresh_output_copies.fetch_add(1, std::memory_order_relaxed);
  if (op != nullptr && opTrackingEnabled()) op->resultCopies.fetch_add(1, std::memory_order_relaxed);
}

namespace {

void fallbackEntry(const c10::OperatorHandle& op, torch::jit::Stack* stack) { genericFallback(op, stack); }

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallbackEntry>());
}

}  // namespace torchneuron
