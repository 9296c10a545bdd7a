// AOTInductor packages on the device: the runner torch's package loader
// (aoti_load_package) creates for a package whose device key is "neuron".
//
// A neuron package is built by torchneuron.compiler's C++ wrapper: Inductor's
// CPU kernels and CPU C shims, compiled into a model library whose own
// buffers and constants live in host memory. The software chip runs kernels
// on host cores against device memory it can address, so the runner hands
// the model CPU views of the device tensors, on the device's executor:
//
// - A call is one work item, "aoti::<model>", on the current stream of the
//   inputs' device, after the work queued before it; the host returns at
//   once with the outputs allocated on the device (the caching allocator).
// - Output layouts are learned once per input layout (dtypes, sizes,
//   strides) by running the model on zero-filled host scratch inputs, so a
//   new shape does not wait for the device. An output that is a view of an
//   input is learned as such and returned as a view of the device input.
//   Each queued run checks its outputs against what was learned (a
//   mismatch is an error naming the model, never a wrong result).
// - A model whose output layouts depend on input values (its library
//   defines torchneuron_aoti_outputs_depend_on_values) runs on the host
//   after waiting for the stream, every call, as eager nonzero does.
// - A model that raises on zeros is run once on the real inputs after
//   waiting for the stream (a host wait noted as verification), and learns
//   from that run.
//
// torch's AOTInductor runtime (model_base.h) accepts only the device strings
// cpu|cuda|xpu|mps, so the model container is created as "cpu": that is what
// its code is.
#include "aten/Common.h"
#include "aten/Launch.h"
#include "aten/KernelArgs.h"
#include "aten/OpTracking.h"
#include "aten/QueuedKernel.h"
#include "core/HostWait.h"
#include "core/Stream.h"

#include <ATen/ATen.h>
#include <ATen/DynamicLibrary.h>
#include <c10/util/Exception.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>
#include <torch/csrc/inductor/aoti_torch/tensor_converter.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace torchneuron {
namespace {

using torch::inductor::AOTIModelContainerRunner;

// What a run returns in output i: a fresh tensor, or a view of input
// `aliasOf` starting `byteOffset` bytes from that input's data.
struct OutputLayout {
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int aliasOf = -1;
  int64_t byteOffset = 0;
};

std::vector<int64_t> layoutKey(const std::vector<at::Tensor>& inputs) {
  std::vector<int64_t> key;
  for (const auto& t : inputs) {
    key.push_back(static_cast<int64_t>(t.scalar_type()));
    key.push_back(t.dim());
    key.insert(key.end(), t.sizes().begin(), t.sizes().end());
    key.insert(key.end(), t.strides().begin(), t.strides().end());
  }
  return key;
}

// Which input's memory, if any, holds `out` (scratch or real run).
OutputLayout layoutOf(const at::Tensor& out, const std::vector<at::Tensor>& inputs) {
  OutputLayout layout{out.scalar_type(), out.sizes().vec(), out.strides().vec()};
  const auto* p = static_cast<const char*>(out.data_ptr());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& storage = inputs[i].storage();
    const auto* base = static_cast<const char*>(storage.data());
    if (storage.nbytes() > 0 && p >= base && p < base + storage.nbytes()) {
      layout.aliasOf = static_cast<int>(i);
      layout.byteOffset = p - static_cast<const char*>(inputs[i].data_ptr());
      break;
    }
  }
  return layout;
}

std::vector<OutputLayout> layoutsOf(const std::vector<at::Tensor>& outs,
                                    const std::vector<at::Tensor>& inputs) {
  std::vector<OutputLayout> layouts;
  for (const auto& o : outs) layouts.push_back(layoutOf(o, inputs));
  return layouts;
}

bool sameLayout(const at::Tensor& t, const OutputLayout& l) {
  return t.scalar_type() == l.dtype && t.sizes().vec() == l.sizes && t.strides().vec() == l.strides;
}

// The work item's name, for the process's life (launchWork keeps the pointer).
const char* internName(const std::string& name) {
  static std::mutex mu;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mu);
  return names.insert(name).first->c_str();
}

// "aoti::<model>": the package's model name is the folder of its library
// (<package>/data/aotinductor/<model>/<hash>.wrapper.so).
std::string workName(const std::string& soPath) {
  std::string dir = soPath.substr(0, soPath.find_last_of('/'));
  std::string model = dir.substr(dir.find_last_of('/') + 1);
  return "aoti::" + (model.empty() ? std::string("model") : model);
}

class NeuronAotiRunner final : public AOTIModelContainerRunner {
 public:
  // The host thread (scratch runs) and the executor (queued runs) both run
  // the model, so never single-threaded; and with one model more than asked
  // for (they share the constants), a scratch run finds one free while a
  // queued run holds another.
  NeuronAotiRunner(const std::string& soPath, size_t numModels, const std::string& cubinDir)
      : AOTIModelContainerRunner(soPath, numModels + 1, "cpu", cubinDir,
                                 /*run_single_threaded=*/false),
        name_(internName(workName(soPath))),
        counters_(opCounters(name_)),
        valueDependent_(definesValueDependentSymbol()) {}

  // Queued runs call into the container: wait for them.
  ~NeuronAotiRunner() override {
    std::unique_lock<std::mutex> lock(pendingMu_);
    pendingDone_.wait(lock, [this] { return pending_ == 0; });
  }

 protected:
  std::vector<at::Tensor> run_impl(std::vector<AtenTensorHandle>& handles,
                                   void* streamHandle) override {
    // The handles are ours (boxed_run/run made them for a stealing callee).
    std::vector<at::Tensor> inputs =
        torch::aot_inductor::alloc_tensors_by_stealing_from_handles(handles.data(),
                                                                     handles.size());
    const c10::DeviceIndex device = deviceOf(inputs);
    if (valueDependent_) return runOnTheHost(inputs, device, WaitCause::DataDependent);
    const std::vector<OutputLayout>* layouts = learned(inputs);
    if (layouts == nullptr) return runOnTheHost(inputs, device, WaitCause::Verification);
    return launch(inputs, *layouts, device);
  }

 private:
  // torchneuron.compiler.aoti writes the symbol into libraries whose output
  // layouts depend on input values (unbacked sizes).
  bool definesValueDependentSymbol() const {
    try {
      return model_so_->sym("torchneuron_aoti_outputs_depend_on_values") != nullptr;
    } catch (const c10::Error&) {
      return false;
    }
  }

  static c10::DeviceIndex deviceOf(const std::vector<at::Tensor>& inputs) {
    std::optional<c10::Device> device;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& t = inputs[i];
      TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1,
                  "AOTInductor package for neuron: input ", i, " is on ", t.device(),
                  "; the package was compiled for neuron tensors (move the inputs with .to('neuron'))");
      TORCH_CHECK(!device || *device == t.device(), "AOTInductor package for neuron: inputs on ",
                  *device, " and ", t.device(), "; all inputs must be on one device");
      TORCH_CHECK(t.layout() == at::kStrided, "AOTInductor package for neuron: input ", i,
                  " is not a strided tensor");
      device = t.device();
    }
    return device ? device->index() : getCurrentStream().device_index();
  }

  // The model's outputs for CPU tensors.
  std::vector<at::Tensor> runOnCpu(const std::vector<at::Tensor>& cpuInputs) {
    auto handles = torch::aot_inductor::unsafe_alloc_new_handles_from_tensors(cpuInputs);
    try {
      auto outs = AOTIModelContainerRunner::run_impl(handles, nullptr);
      torch::aot_inductor::free_unstolen_handles(handles);
      return outs;
    } catch (...) {
      torch::aot_inductor::free_unstolen_handles(handles);
      throw;
    }
  }

  // The output layouts for these inputs' layouts, learned on zero-filled
  // scratch inputs the first time; null if the model raised on them.
  const std::vector<OutputLayout>* learned(const std::vector<at::Tensor>& inputs) {
    auto key = layoutKey(inputs);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = layouts_.find(key);
      if (it != layouts_.end()) return &it->second;
    }
    std::vector<at::Tensor> scratch;
    for (const auto& t : inputs)
      scratch.push_back(at::empty_strided(t.sizes(), t.strides(),
                                          at::TensorOptions().dtype(t.scalar_type())).zero_());
    std::vector<at::Tensor> outs;
    try {
      outs = runOnCpu(scratch);
    } catch (const std::exception&) {
      return nullptr;  // values matter to it: learn from a real run
    }
    return remember(std::move(key), layoutsOf(outs, scratch));
  }

  const std::vector<OutputLayout>* remember(std::vector<int64_t> key,
                                            std::vector<OutputLayout> layouts) {
    std::lock_guard<std::mutex> lock(mu_);
    return &layouts_.emplace(std::move(key), std::move(layouts)).first->second;
  }

  // A run on the host after waiting for the stream: for a model whose
  // output layouts depend on values (every call), or one that raised on
  // zeros (once: it learns the layouts from this run).
  std::vector<at::Tensor> runOnTheHost(const std::vector<at::Tensor>& inputs,
                                       c10::DeviceIndex device, WaitCause cause) {
    noteHostWait(cause, name_);
    getCurrentStream(device).synchronize();
    std::vector<at::Tensor> views;
    for (const auto& t : inputs) views.push_back(cpuAlias(t));
    auto outs = runOnCpu(views);
    recordOp(counters_, OpPath::Inline);
    std::vector<OutputLayout> layouts = layoutsOf(outs, views);
    if (cause == WaitCause::Verification) remember(layoutKey(inputs), layouts);
    std::vector<at::Tensor> results;
    for (size_t i = 0; i < outs.size(); ++i) {
      results.push_back(outputFor(layouts[i], inputs, device));
      if (layouts[i].aliasOf < 0) cpuAlias(results.back()).copy_(outs[i]);
    }
    return results;
  }

  // Output `l` on the device: a view of the input it aliases, else fresh
  // memory from the caching allocator.
  static at::Tensor outputFor(const OutputLayout& l, const std::vector<at::Tensor>& inputs,
                              c10::DeviceIndex device) {
    if (l.aliasOf < 0) {
      return at::empty_strided(l.sizes, l.strides,
                               at::TensorOptions().dtype(l.dtype).device(
                                   c10::Device(c10::DeviceType::PrivateUse1, device)));
    }
    const at::Tensor& input = inputs[l.aliasOf];
    const int64_t itemsize = static_cast<int64_t>(c10::elementSize(l.dtype));
    TORCH_CHECK(l.byteOffset % itemsize == 0 && input.scalar_type() == l.dtype,
                "AOTInductor package for neuron: an output views an input with another dtype");
    return input.as_strided(l.sizes, l.strides,
                            input.storage_offset() + l.byteOffset / itemsize);
  }

  // Allocates the outputs and queues the run.
  std::vector<at::Tensor> launch(const std::vector<at::Tensor>& inputs,
                                 const std::vector<OutputLayout>& layouts,
                                 c10::DeviceIndex device) {
    // The work item holds raw pointers and geometry only (see launchWork).
    std::vector<at::Tensor> results;
    WorkDesc work;
    work.name = name_;
    std::vector<TensorRef> ins, outs;
    for (const auto& t : inputs) {
      ins.emplace_back(t, /*written=*/false);
      work.reads.push_back(spanOf(ins.back()));
    }
    for (const auto& l : layouts) {
      results.push_back(outputFor(l, inputs, device));
      outs.emplace_back(results.back());
      work.writes.push_back(spanOf(outs.back()));
    }
    {
      std::lock_guard<std::mutex> lock(pendingMu_);
      ++pending_;
    }
    // Whether the item ran: a launch can fail after running it
    // (NEURON_LAUNCH_BLOCKING=1) or without queueing it.
    auto ran = std::make_shared<std::atomic<bool>>(false);
    try {
      launchWork(getCurrentStream(device), work,
                 [this, ran, ins = std::move(ins), outs = std::move(outs), &layouts] {
                   ran->store(true);
                   Done done{this};
                   runQueued(ins, outs, layouts);
                 });
    } catch (...) {
      if (!ran->load()) finished();
      throw;
    }
    recordOp(counters_, OpPath::Async);
    return results;
  }

  // Runs on the executor: the model on host views of the device tensors,
  // its outputs checked against the learned layouts and copied into place.
  void runQueued(const std::vector<TensorRef>& ins, const std::vector<TensorRef>& outs,
                 const std::vector<OutputLayout>& layouts) {
    std::vector<at::Tensor> views;
    for (const auto& r : ins) views.push_back(r.cpu());
    auto got = runOnCpu(views);
    TORCH_CHECK(got.size() == outs.size(), name_, ": the model returned ", got.size(),
                " outputs, expected ", outs.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const OutputLayout& l = layouts[i];
      const OutputLayout now = layoutOf(got[i], views);
      TORCH_CHECK(sameLayout(got[i], l) && now.aliasOf == l.aliasOf &&
                      (l.aliasOf < 0 || now.byteOffset == l.byteOffset),
                  name_, ": output ", i, " has sizes ", got[i].sizes(), " and strides ",
                  got[i].strides(), " where a run with zero-filled inputs of the same shapes gave ",
                  c10::IntArrayRef(l.sizes), " and ", c10::IntArrayRef(l.strides),
                  " (the neuron runner does not support outputs whose layout depends on input "
                  "values)");
      if (l.aliasOf < 0) outs[i].cpu().copy_(got[i]);
    }
  }

  struct Done {
    NeuronAotiRunner* runner;
    ~Done() { runner->finished(); }
  };
  void finished() {
    std::lock_guard<std::mutex> lock(pendingMu_);
    if (--pending_ == 0) pendingDone_.notify_all();
  }

  const char* name_;
  OpCounters* counters_;
  const bool valueDependent_;
  std::mutex mu_;
  std::map<std::vector<int64_t>, std::vector<OutputLayout>> layouts_;  // entries never move
  std::mutex pendingMu_;
  std::condition_variable pendingDone_;
  int pending_ = 0;
};

std::unique_ptr<AOTIModelContainerRunner> createRunner(const std::string& soPath, size_t numModels,
                                                       const std::string& /*deviceStr*/,
                                                       const std::string& cubinDir,
                                                       const bool /*runSingleThreaded*/) {
  return std::make_unique<NeuronAotiRunner>(soPath, numModels, cubinDir);
}

const torch::inductor::RegisterAOTIModelRunner registerRunner("neuron", &createRunner);

}  // namespace
}  // namespace torchneuron
