// torchneuron._C: the thin Python binding of the backend library. Everything
// that can be reached through torch itself (streams, events, memory stats,
// generators via torch.accelerator) is not duplicated here.
#include "aten/AsyncPath.h"
#include "aten/Fusion.h"
#include "aten/Gemm.h"
#include "aten/FlashBackward.h"
#include "aten/SerialGemm.h"
#include "aten/ListLoop.h"
#include "aten/Launch.h"
#include "core/ComputeThreads.h"
#include "core/SerialCompute.h"
#include "core/DeviceAllocator.h"
#include "core/HostWait.h"
#include "core/KernelWarnings.h"
#include "aten/Common.h"
#include "aten/OpTracking.h"
#include "aten/RowSum.h"

namespace torchneuron {
int64_t freshOutputCopies();
bool allocationRedirectInstalled();
void drainDevicesAtExit() noexcept;  // core/Runtime.cpp
}  // namespace torchneuron

#include "core/Generator.h"
#include "core/Runtime.h"
#include "core/Stream.h"
#include "inductor/CompiledLaunch.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <cstring>
#include <thread>
#include <vector>

namespace py = pybind11;

// torch/csrc/profiler/python/combined_traceback.h declares it, but includes a
// header the wheel does not ship (nlohmann/json).
namespace torch {
void installCapturedTracebackPython();
}

namespace torchneuron {
void registerMemoryBindings(py::module& m);
void registerDistributedBindings(py::module& m);
void installMetaRefusalTest();

namespace {

py::dict pyDeviceProperties(int index) {
  const auto& p = torchneuron::deviceProperties(static_cast<c10::DeviceIndex>(index));
  py::dict d;
  d["name"] = std::string(p.name);
  d["total_memory"] = p.totalMemory;
  d["compute_threads"] = p.computeThreads;
  d["executor_threads"] = p.executorThreads;
  d["physical_core"] = p.physicalCore;
  d["stream_priority_least"] = p.streamPriorityLeast;
  d["stream_priority_greatest"] = p.streamPriorityGreatest;
  return d;
}

// A kernel that keeps its stream busy for a while (like torch.cuda._sleep):
// lets tests observe asynchronous execution deterministically.
nrtStatus sleepKernel(void* args) {
  int64_t us = 0;
  std::memcpy(&us, args, sizeof(us));
  std::this_thread::sleep_for(std::chrono::microseconds(us));
  return NRT_SUCCESS;
}

py::dict pyExecutedOps() {
  py::dict out;
  for (const auto& [name, rec] : torchneuron::executedOps()) {
    py::dict r;
    r["native"] = rec.native;
    r["async"] = rec.async;
    r["fallback"] = rec.fallback;
    r["inline"] = rec.inlined;
    out[py::str(name)] = r;
  }
  return out;
}

// The host waits since the last clear, oldest first, each with its Python
// stack (innermost frame last, as traceback.extract_stack gives it).
py::list pyHostWaits() {
  std::vector<HostWaitRecord> waits = hostWaits();
  std::vector<torch::CapturedTraceback*> stacks;
  for (const auto& w : waits)
    if (w.stack) stacks.push_back(w.stack.get());
  torch::SymbolizedTracebacks sym = torch::symbolize(stacks);
  py::list out;
  size_t k = 0;
  for (const auto& w : waits) {
    py::dict d;
    d["cause"] = waitCauseName(w.cause);
    d["op"] = w.op;
    py::list frames;
    if (w.stack) {
      const auto& idx = sym.tracebacks.at(k++);
      // CapturedTraceback lists the innermost frame first.
      for (auto it = idx.rbegin(); it != idx.rend(); ++it) {
        const auto& f = sym.all_frames.at(*it);
        frames.append(py::make_tuple(f.filename, f.lineno, f.funcname));
      }
    }
    d["stack"] = frames;
    out.append(d);
  }
  return out;
}

py::dict pyHostWaitCounts() {
  py::dict out;
  std::vector<int64_t> counts = hostWaitCounts();
  for (size_t i = 0; i < counts.size(); ++i)
    out[waitCauseName(static_cast<WaitCause>(i))] = counts[i];
  return out;
}

}  // namespace
}  // namespace torchneuron

// Inductor passes a one-element CPU tensor to a device kernel by pointer (a
// CPU scalar in a neuron graph: torchao's step count, a tensor learning
// rate). A queued kernel reads it later, after the host may have changed or
// freed it, so the kernel module's launch copies the value into the work
// item's arguments, as CUDA passes a CPU scalar by value at launch. Returns
// 1 (copied into out), 0 (not a CPU tensor) or -1 (Python error set).
static int snapshotHostScalar(PyObject* obj, void* out, size_t capacity) {
  if (!THPVariable_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "a compiled neuron kernel takes tensors for its pointers");
    return -1;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.is_cpu()) return 0;
  if (t.numel() != 1 || t.nbytes() > capacity) {
    PyErr_Format(PyExc_RuntimeError,
                 "a compiled neuron kernel was given a CPU tensor of %lld elements; only "
                 "one-element CPU tensors (scalars) can be read by device kernels",
                 static_cast<long long>(t.numel()));
    return -1;
  }
  std::memcpy(out, t.data_ptr(), t.nbytes());
  return 1;
}

PYBIND11_MODULE(_C, m) {
  // Python frames for CapturedTraceback (host-wait and allocation stacks).
  torch::installCapturedTracebackPython();
  // All static registrations of the backend are done by now.
  torchneuron::registerCpuParityKernels();
  torchneuron::installMetaRefusalTest();
  using namespace torchneuron;
  m.doc() = "torchneuron backend bindings";
  m.def("_init", [] { lazyInit(); });
  m.def("_is_initialized", [] { return isInitialized(); });
  m.def("_is_in_bad_fork", [] { return isInBadFork(); });
  m.def("_init_error", [] { return initError(); });
  m.def("_drain_devices_at_exit", [] {
    py::gil_scoped_release no_gil;
    drainDevicesAtExit();
  });
  m.def("_device_count", [] { return static_cast<int>(deviceCount()); });
  m.def("_get_device", [] { return static_cast<int>(currentDevice()); });
  m.def("_set_device", [](int d) { setCurrentDevice(static_cast<c10::DeviceIndex>(d)); });
  m.def("_exchange_device", [](int d) {
    const int old = currentDevice();
    if (d >= 0 && d != old) setCurrentDevice(static_cast<c10::DeviceIndex>(d));
    return old;
  });
  m.def("_synchronize", [](int d) {
    lazyInit();
    nrtStatus st;
    {
      // Warnings of queued work, as Python warnings: those the host-wait
      // note flushes (work finished earlier) and those of the work waited for.
      torch::PyWarningHandler python_warnings;
      noteHostWait(WaitCause::Synchronize, "synchronize");
      {
        py::gil_scoped_release no_gil;
        st = nrtDeviceSynchronize(resolveDevice(static_cast<c10::DeviceIndex>(d)));
      }
      flushKernelWarnings();
    }
    if (st != NRT_SUCCESS) throwRuntimeError(st, "torch.neuron.synchronize", __FILE__, __LINE__);
  });
  // Checkpoint storages are not resizable, as on CPU (torchneuron/_serialization.py).
  m.def("_set_storage_resizable", [](const py::object& storage, bool resizable) {
    c10::Storage s = torch::createStorage(storage.ptr());
    s.unsafeGetStorageImpl()->set_resizable(resizable);
  });
  m.def("_get_device_properties", &pyDeviceProperties);
  m.def("_stream_priority_range", [](int d) {
    return priorityRange(static_cast<c10::DeviceIndex>(d));
  });
  m.def("_stream_priority", [](int64_t id, int d) {
    return NeuronStream(c10::Stream(c10::Stream::UNSAFE,
                                    c10::Device(c10::DeviceType::PrivateUse1,
                                                static_cast<c10::DeviceIndex>(d)),
                                    static_cast<c10::StreamId>(id)))
        .priority();
  });
  m.def("_get_default_generator", [](int d) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(getDefaultGenerator(static_cast<c10::DeviceIndex>(d))));
  });
  m.def("_sleep", [](int64_t microseconds) {
    lazyInit();
    const int64_t us = microseconds;
    NEURON_CHECK(nrtLaunchKernel(getCurrentStream().handle(), "torchneuron::_sleep", &sleepKernel,
                                 &us, sizeof(us)));
  });
  // The intra-op thread count a kernel on the current stream computes with
  // (ComputeThreads.h): queues one that reads it, waits, returns it.
  m.def("_kernel_compute_threads", [] {
    lazyInit();
    auto seen = std::make_shared<std::atomic<int>>(0);
    launchOnStream(getCurrentStream(), "torchneuron::_kernel_compute_threads",
                   [seen] { seen->store(currentComputeThreads()); });
    getCurrentStream().synchronize();
    return seen->load();
  });
  // MKL's count on a kernel of the current stream and the part that is the
  // worker's own (ComputeThreads.cpp, alignMklThreads).
  m.def("_kernel_mkl_threads", [] {
    lazyInit();
    auto seen = std::make_shared<std::pair<int, int>>();
    launchOnStream(getCurrentStream(), "torchneuron::_kernel_mkl_threads",
                   [seen] { *seen = currentMklThreads(); });
    getCurrentStream().synchronize();
    return *seen;
  });
  m.def("_build_info", [] {
    py::dict d;
    d["compiler"] = std::string(__VERSION__);
    d["cplusplus"] = static_cast<long>(__cplusplus);
#ifdef NDEBUG
    d["assertions"] = false;
#else
    d["assertions"] = true;
#endif
    return d;
  });
  m.def("_executed_ops", &pyExecutedOps);
  m.def("_host_waits", &pyHostWaits);
  m.def("_host_wait_counts", &pyHostWaitCounts);
  m.def("_clear_host_waits", [] { clearHostWaits(); });
  m.def("_set_sync_debug_mode", [](int mode) { setSyncDebugMode(mode); });
  m.def("_get_sync_debug_mode", [] { return syncDebugMode(); });
  m.def("_fresh_output_copies", [] { return freshOutputCopies(); });
  m.def("_result_copies", [] { return torchneuron::resultCopies(); });
  m.def("_allocation_redirect_installed", [] { return allocationRedirectInstalled(); });
  m.def("_clear_op_tracking", [] { clearOpTracking(); });
  m.def("_set_async_path", [](bool on) { setAsyncPathEnabled(on); });
  m.def("_async_path_enabled", [] { return asyncPathEnabled(); });
  m.def("_set_op_tracking", [](bool on) { setOpTrackingEnabled(on); });
  m.def("_set_fusion_enabled", [](bool on) { setFusionEnabled(on); });
  m.def("_fusion_enabled", [] { return fusionEnabled(); });
  m.def("_clear_fusion_stats", [] { clearFusionStats(); });
  m.def("_list_loops_available", [] { return listLoopsAvailable(); });
  m.def("_list_loops_enabled", [] { return listLoopsEnabled(); });
  m.def("_set_list_loops_enabled", [](bool on) { setListLoopsEnabled(on); });
  m.def("_set_sqrt_loops_enabled", [](bool on) { setSqrtLoopsEnabled(on); });
  m.def("_row_sum_lanes", [] { return py::make_tuple(rowSumLanesFloat(), rowSumLanesDouble()); });
  m.def("_set_row_sums_enabled", [](bool on) { setRowSumsEnabled(on); });
  m.def("_set_gemm_plans_enabled", [](bool on) { setGemmPlansEnabled(on); });
  m.def("_gemm_plans_enabled", [] { return gemmPlansEnabled(); });
  m.def("_gemm_plans_made", [] { return gemmPlansMade(); });
  m.def("_set_serial_kernels_enabled", [](bool on) { setSerialKernelsEnabled(on); });
  m.def("_serial_kernels_enabled", [] { return serialKernelsEnabled(); });
  m.def("_serial_kernels_run", [] { return serialKernelsRun(); });
  m.def("_serial_gemm_geometries", [] {
    const SerialGemmStats st = serialGemmStats();
    return py::make_tuple(st.tried, st.agreed);
  });
  m.def("_flash_backward_bf16_available", [] { return flashBackwardBf16Available(); });
  m.def("_set_flash_backward_bf16_enabled", [](bool on) { setFlashBackwardBf16Enabled(on); });
  m.def("_flash_backward_bf16_enabled", [] { return flashBackwardBf16Enabled(); });
  m.def("_flash_backward_bf16_stats", [] {
    const FlashBackwardStats st = flashBackwardStats();
    return py::make_tuple(st.run, st.tried, st.agreed);
  });
  m.def("_set_allocator_reuse_bins", [](bool on) { setAllocatorReuseBins(on); });
  m.def("_fusion_stats", [] {
    const FusionStats st = fusionStats();
    py::dict ops;
    for (const auto& [name, n] : st.byOp) ops[py::str(name)] = n;
    py::dict d;
    d["passes"] = st.passes;
    d["ops"] = st.ops;
    d["by_op"] = ops;
    d["blocked_list_passes"] = st.blockedListPasses;
    d["list_loop_ops"] = st.loopOps;
    d["flat_loop_ops"] = st.flatLoopOps;
    d["broadcast_loop_ops"] = st.broadcastLoopOps;
    return d;
  });
  registerMemoryBindings(m);  // MemoryBindings.cpp
  registerDistributedBindings(m);  // DistributedBindings.cpp
  m.def("_is_pinned_ptr", [](uintptr_t p) {
    nrtPointerAttributes attr{};
    NEURON_CHECK(nrtPointerGetAttributes(&attr, reinterpret_cast<void*>(p)));
    return attr.type == nrtMemoryTypeHost;
  });
  // Testing aid: takes (and discards) the runtime's pending activity records
  // and says how many there were. Outside a profiling session there must be
  // none: recording is off.
  m.def("_drain_activity_records", [] {
    lazyInit();
    std::vector<nrtActivityRecord> records(1024);
    size_t total = 0;
    size_t count = 0;
    do {
      NEURON_CHECK(nrtActivityDrain(records.data(), records.size(), &count, nullptr));
      total += count;
    } while (count == records.size());
    return total;
  });
  m.def("_pointer_device", [](uintptr_t p) {
    nrtPointerAttributes attr{};
    NEURON_CHECK(nrtPointerGetAttributes(&attr, reinterpret_cast<void*>(p)));
    return attr.type == nrtMemoryTypeDevice ? attr.device : -1;
  });
  m.def("_compiled_kernel_handle", [](const std::string& name, int device) {
    return reinterpret_cast<uintptr_t>(torchneuron_compiled_kernel(name.c_str(), device));
  });
  m.def("_custom_kernel_handle", [](const std::string& name, int device) {
    return reinterpret_cast<uintptr_t>(torchneuron_custom_kernel(name.c_str(), device));
  });
  m.def("_parallel_for_address",
        [] { return reinterpret_cast<uintptr_t>(&torchneuron_parallel_for); });
  // The C entries compiled kernel modules call (inductor/CompiledLaunch.h).
  m.def("_compiled_launch_address",
        [] { return reinterpret_cast<uintptr_t>(&torchneuron_launch_compiled); });
  m.def("_host_scalar_address", [] { return reinterpret_cast<uintptr_t>(&snapshotHostScalar); });
}
