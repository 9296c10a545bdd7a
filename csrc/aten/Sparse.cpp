// Sparse.cpp — sparse COO tensors on neuron (DispatchKey SparsePrivateUse1).
//
// A sparse neuron tensor is ATen's own SparseTensorImpl whose indices and
// values are dense neuron tensors, as on CUDA. Two kinds of kernels:
//   - metadata and construction (sparse_dim, _indices, _values, coalesced
//     flag, resizing, empty, copy_, zero_, the tensor-with-indices-and-values
//     constructor): ATen's own kernels, which are device-generic (they are
//     also SparseMeta's);
//   - everything else (the boxed fallback below): synchronous, through CPU.
//     Sparse neuron arguments become CPU sparse tensors (indices and values
//     copied, same coalesced flag), dense neuron arguments CPU copies, a
//     neuron Device argument CPU; the op's CPU kernel runs (SparseCPU or CPU,
//     whichever the arguments select); results come back to the device
//     (sparse as sparse), unless a Device argument asked for CPU. Written
//     arguments take the CPU result back (sparse: copy_ swaps in the new
//     indices and values). Results are CPU's, bitwise.
// Ops that have a SparseCPU kernel but would reach SparsePrivateUse1 through
// a composite decomposition meant for dense tensors (clone, is_pinned, ...)
// are routed to the fallback explicitly, at load time.
#include "aten/Common.h"
#include "core/HostWait.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_dimI_native.h>
#include <ATen/ops/_dimV_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/copy_sparse_to_sparse_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/sparse_resize_and_clear_native.h>
#include <ATen/ops/sparse_resize_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/zero_native.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/flat_hash_map.h>
#include <torch/library.h>

#include <string>
#include <vector>

namespace torchneuron {
namespace {

// A sparse COO tensor on `device` with t's shape, dims and coalesced flag,
// over indices/values already there.
at::Tensor sparseOver(const at::Tensor& like, const at::Tensor& indices, const at::Tensor& values,
                      c10::Device device) {
  return at::_sparse_coo_tensor_with_dims_and_tensors(
      like.sparse_dim(), like.dense_dim(), like.sizes(), indices, values,
      like.options().device(device), like.is_coalesced());
}

at::Tensor sparseTo(const at::Tensor& t, c10::Device device) {
  return sparseOver(t, t._indices().to(device), t._values().to(device), device);
}

struct SparseCall {
  std::string name;
  c10::DeviceIndex device = -1;
  bool cpu_device_arg = false;  // a Device argument asked for CPU
  bool neuron_device_arg = false;
  ska::flat_hash_map<c10::TensorImpl*, at::Tensor> by_impl;  // neuron -> CPU twin
  std::vector<std::pair<at::Tensor, at::Tensor>> written;    // (neuron, CPU twin)
  // CPU twin storage -> the neuron storage it copies (same layout), so that a
  // result sharing memory with an argument (a sparse result over its input's
  // indices, say) shares it on the device too, as on CPU
  ska::flat_hash_map<c10::StorageImpl*, c10::Storage> storages;
};

// Records that dense CPU tensor `twin` copies neuron tensor `t` (when they
// lay the bytes out alike).
void noteTwin(SparseCall& c, const at::Tensor& t, const at::Tensor& twin) {
  if (!twin.has_storage() || twin.strides() != t.strides() ||
      twin.storage_offset() != t.storage_offset()) {
    return;
  }
  c.storages.emplace(twin.storage().unsafeGetStorageImpl(), t.storage());
}

[[noreturn]] void mismatch(const SparseCall& c, c10::Device other) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two "
                     "devices, ", c10::Device(kNeuron, c.device), " and ", other,
                     "! (while running ", c.name, " on sparse neuron tensors)");
}

void noteDevice(SparseCall& c, c10::Device d) {
  if (c.device < 0) {
    c.device = d.index() < 0 ? currentDevice() : d.index();
  } else if (d.index() >= 0 && c.device != d.index()) {
    mismatch(c, d);
  }
}

at::Tensor toCpu(SparseCall& c, const at::Tensor& t, bool written) {
  if (!t.defined()) return t;
  if (!isNeuron(t)) {
    // As on CUDA: CPU scalars (0-dim dense) may mix in, nothing else.
    if (!c.neuron_device_arg && !c.cpu_device_arg && (t.is_sparse() || t.dim() != 0)) {
      mismatch(c, t.device());
    }
    return t;
  }
  auto seen = c.by_impl.find(t.unsafeGetTensorImpl());
  at::Tensor cpu;
  if (seen != c.by_impl.end()) {
    cpu = seen->second;
  } else {
    if (t.is_sparse()) {
      cpu = sparseTo(t, c10::Device(c10::kCPU));
      noteTwin(c, t._indices(), cpu._indices());
      noteTwin(c, t._values(), cpu._values());
    } else {
      TORCH_CHECK_NOT_IMPLEMENTED(t.layout() == at::kStrided, c.name, " got a ", t.layout(),
                                  " neuron tensor: neuron supports the strided and sparse COO "
                                  "layouts only");
      cpu = t.to(c10::Device(c10::kCPU));
      noteTwin(c, t, cpu);
    }
    c.by_impl.emplace(t.unsafeGetTensorImpl(), cpu);
  }
  if (written) noteWritten(c.written, t, cpu);
  return cpu;
}

// A dense CPU result on the device with the same sizes, strides and storage
// offset (CPU's layouts are observable: autograd copies a sparse gradient
// whose indices are not contiguous). Results sharing a CPU storage share one
// device storage.
at::Tensor denseToDevice(SparseCall& c, const at::Tensor& r) {
  if (!r.has_storage()) return r.to(c10::Device(kNeuron, c.device));
  c10::StorageImpl* impl = r.storage().unsafeGetStorageImpl();
  auto it = c.storages.find(impl);
  if (it == c.storages.end()) {
    const int64_t nbytes = static_cast<int64_t>(impl->nbytes());
    at::Tensor bytes = at::empty({0}, at::TensorOptions().dtype(at::kByte));
    bytes.set_(r.storage(), 0, {nbytes}, {1});
    at::Tensor moved = bytes.to(c10::Device(kNeuron, c.device));
    it = c.storages.emplace(impl, moved.storage()).first;
  }
  return tensorOverStorage(it->second, r, c10::DispatchKey::PrivateUse1);
}

at::Tensor toDevice(SparseCall& c, const at::Tensor& r) {
  if (!r.defined() || !r.device().is_cpu()) return r;
  for (const auto& [original, twin] : c.written) {
    if (twin.is_same(r)) return original;
  }
  const c10::Device dev(kNeuron, c.device);
  if (r.is_sparse()) {
    return sparseOver(r, toDevice(c, r._indices()), toDevice(c, r._values()), dev);
  }
  TORCH_CHECK_NOT_IMPLEMENTED(r.layout() == at::kStrided, c.name, " returned a ", r.layout(),
                              " tensor: neuron supports the strided and sparse COO layouts only");
  return denseToDevice(c, r);
}

void syncWritten(const at::Tensor& original, const at::Tensor& twin) {
  if (original.is_sparse()) {
    TORCH_CHECK(twin.is_sparse(), "sparse neuron tensor written with a ", twin.layout(), " result");
    original.copy_(twin);  // copy_sparse_: resizes and takes new indices/values
    return;
  }
  if (original.sizes() != twin.sizes()) original.resize_(twin.sizes());
  original.copy_(twin);
}

void sparseFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t num_args = arguments.size();
  const size_t begin = stack->size() - num_args;

  SparseCall c;
  c.name = fullName(schema.operator_name());
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& iv = (*stack)[begin + i];
    forEachTensor(iv, [&](const at::Tensor& t) {
      if (isNeuron(t)) noteDevice(c, t.device());
    });
    const bool deviceArg = isKindOrOptional(arguments[i].type(), c10::TypeKind::DeviceObjType);
    if (iv.isDevice() && deviceArg) {
      if (iv.toDevice().type() == kNeuron) {
        c.neuron_device_arg = true;
        noteDevice(c, iv.toDevice());
      } else if (iv.toDevice().is_cpu()) {
        c.cpu_device_arg = true;
      }
    }
  }
  if (c.device < 0) c.device = currentDevice();
  c10::DeviceGuard guard(c10::Device(kNeuron, c.device));
  recordOp(c.name, OpPath::Fallback);
  noteHostWait(WaitCause::SyncPath, fullName(op.schema().operator_name()));
  getCurrentStream(c.device).synchronize();

  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& iv = (*stack)[begin + i];
    const auto& arg = arguments[i];
    const bool written = arg.alias_info() != nullptr && arg.alias_info()->isWrite();
    if (iv.isTensor() || iv.isTensorList() || iv.isOptionalTensorList()) {
      iv = mapTensors(iv, [&](const at::Tensor& t) { return toCpu(c, t, written); });
    } else if (iv.isDevice() && iv.toDevice().type() == kNeuron) {
      iv = c10::Device(c10::kCPU);
    }
  }

  // The CPU arguments select SparseCPU's or CPU's kernel (autograd is
  // already below us).
  op.callBoxed(stack);

  for (auto& [original, twin] : c.written) syncWritten(original, twin);
  // A Device argument asking for CPU (and none for neuron): results stay there.
  if (c.cpu_device_arg && !c.neuron_device_arg) return;
  const size_t num_returns = schema.returns().size();
  const size_t rbegin = stack->size() - num_returns;
  for (size_t i = 0; i < num_returns; ++i) {
    c10::IValue& iv = (*stack)[rbegin + i];
    iv = mapTensors(iv, [&](const at::Tensor& t) { return toDevice(c, t); });
  }
}

}  // namespace

namespace {

// Factories under a guard for their device, as the dispatcher's generated
// wrappers do for CUDA: SparseTensorImpl takes the current device.
c10::Device factoryDevice(std::optional<c10::Device> device, const at::Tensor* like = nullptr) {
  if (device.has_value() && device->type() == kNeuron) {
    return c10::Device(kNeuron, device->index() < 0 ? currentDevice() : device->index());
  }
  if (like != nullptr && isNeuron(*like)) return like->device();
  return c10::Device(kNeuron, currentDevice());
}

at::Tensor withDimsAndTensors(int64_t sparse_dim, int64_t dense_dim, c10::SymIntArrayRef size,
                              const at::Tensor& indices, const at::Tensor& values,
                              std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                              std::optional<c10::Device> device, std::optional<bool> pin_memory,
                              std::optional<bool> is_coalesced) {
  c10::DeviceGuard guard(factoryDevice(device, &values));
  return at::native::new_with_dims_and_tensor_sparse_symint(
      sparse_dim, dense_dim, size, indices, values, dtype, layout, device, pin_memory,
      is_coalesced);
}

at::Tensor withDims(int64_t sparse_dim, int64_t dense_dim, at::IntArrayRef size,
                    std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                    std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  c10::DeviceGuard guard(factoryDevice(device));
  return at::native::new_with_dims_sparse(sparse_dim, dense_dim, size, dtype, layout, device,
                                          pin_memory);
}

at::Tensor emptySparse(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                       std::optional<at::Layout> layout, std::optional<c10::Device> device,
                       std::optional<bool> pin_memory,
                       std::optional<at::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(factoryDevice(device));
  return at::native::empty_sparse_symint(size, dtype, layout, device, pin_memory, memory_format);
}

at::Tensor emptyLikeSparse(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                           std::optional<at::Layout> layout, std::optional<c10::Device> device,
                           std::optional<bool> pin_memory,
                           std::optional<at::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(factoryDevice(device, &self));
  return at::native::empty_like_sparse_coo(self, dtype, layout, device, pin_memory,
                                           memory_format);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(withDimsAndTensors));
  m.impl("_sparse_coo_tensor_with_dims", TORCH_FN(withDims));
  m.impl("empty.memory_format", TORCH_FN(emptySparse));
  m.impl("empty_like", TORCH_FN(emptyLikeSparse));
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  m.impl("sparse_resize_", TORCH_FN(at::native::sparse_resize_));
  m.impl("sparse_resize_and_clear_", TORCH_FN(at::native::sparse_resize_and_clear_));
  m.impl("copy_sparse_to_sparse_", TORCH_FN(at::native::copy_sparse_));
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_wrapper_));
  m.impl("zero_", TORCH_FN(at::native::zero_sparse_));
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparseFallback>());
}

namespace {

// Ops with a SparseCPU kernel whose SparsePrivateUse1 entry would otherwise
// be a composite kernel for dense tensors: the fallback, explicitly. Runs at
// load time, after the registrations above (same translation unit) and
// after libtorch_cpu's (a dependency, loaded first).
struct RouteSparseCpuKernels {
  RouteSparseCpuKernels() {
    auto* lib = new torch::Library(torch::Library::IMPL, "aten",
                                   c10::DispatchKey::SparsePrivateUse1, __FILE__, __LINE__);
    static std::vector<std::string> names;  // Library::impl keeps the pointer
    auto& dispatcher = c10::Dispatcher::singleton();
    std::vector<std::string> todo;
    for (const c10::OperatorName& on : dispatcher.getAllOpNames()) {
      if (on.name.rfind("aten::", 0) != 0) continue;
      auto op = dispatcher.findOp(on);
      if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::SparsePrivateUse1)) continue;
      if (!op->hasKernelForDispatchKey(c10::DispatchKey::SparseCPU)) continue;
      todo.push_back(fullName(on));
    }
    names.reserve(todo.size());
    for (auto& name : todo) {
      names.push_back(name);
      lib->impl(names.back().c_str(), torch::CppFunction::makeFromBoxedFunction<&sparseFallback>());
    }
  }
};
RouteSparseCpuKernels g_route_sparse_cpu_kernels;

}  // namespace

}  // namespace torchneuron
