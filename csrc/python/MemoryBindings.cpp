// torchneuron._C bindings of the allocator's memory history: settings from
// torch.cuda.memory._record_memory_history's arguments, and the snapshot as
// the dicts torch.cuda.memory._snapshot returns (the format
// torch.cuda._memory_viz and pytorch.org/memory_viz read). Stacks recorded
// by the allocator are symbolized here, at snapshot time.
#include "core/MemoryHistory.h"
#include "core/Runtime.h"

#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace torchneuron {
namespace {

// Python frames may be gathered on threads Python knows (see
// setPythonStackProbe). Reading the thread's state needs no GIL.
bool threadKnownToPython() { return PyGILState_GetThisThreadState() != nullptr; }

const char* actionName(TraceEntry::Action a);

void recordHistory(const std::optional<std::string>& enabled,
                   const std::optional<std::string>& context, const std::string& stacks,
                   size_t max_entries, bool clear_history,
                   const std::vector<std::string>& skip_actions) {
  // CUDA's checks and messages, as ValueError.
  TORCH_CHECK_VALUE(!enabled || *enabled == "state" || *enabled == "all",
                    "expected enabled to be 'state', 'all', or None, got '", *enabled, "'");
  TORCH_CHECK_VALUE(
      !context || *context == "state" || *context == "alloc" || *context == "all",
      "expected context to be 'state', 'alloc', 'all', or None, got '", *context, "'");
  TORCH_CHECK_VALUE(stacks == "python" || stacks == "all",
                    "expected stacks to be 'python' or 'all', got '", stacks, "'");
  HistorySettings s;
  s.enabled = enabled.has_value();
  s.trace = enabled && *enabled == "all";
  s.context = !context               ? RecordContext::kNever
              : *context == "state" ? RecordContext::kState
              : *context == "alloc" ? RecordContext::kAlloc
                                    : RecordContext::kAll;
  s.cppStacks = stacks == "all";
  s.maxEntries = s.trace ? max_entries : 1;
  s.clear = clear_history;
  for (const std::string& name : skip_actions) {
    bool known = false;
    for (int a = TraceEntry::kAlloc; a <= TraceEntry::kSnapshot; ++a) {
      if (name == actionName(static_cast<TraceEntry::Action>(a))) {
        s.skipActions |= 1u << a;
        known = true;
      }
    }
    TORCH_CHECK_VALUE(known, "skip_actions: unknown action '", name,
                      "'; expected alloc, free_requested, free_completed, segment_alloc, "
                      "segment_free, oom or snapshot");
  }
  lazyInit();
  recordMemoryHistory(s);
}

const char* actionName(TraceEntry::Action a) {
  switch (a) {
    case TraceEntry::kAlloc: return "alloc";
    case TraceEntry::kFreeRequested: return "free_requested";
    case TraceEntry::kFreeCompleted: return "free_completed";
    case TraceEntry::kSegmentAlloc: return "segment_alloc";
    case TraceEntry::kSegmentFree: return "segment_free";
    case TraceEntry::kOom: return "oom";
    case TraceEntry::kSnapshot: return "snapshot";
  }
  return "unknown";
}

const char* stateName(BlockSnapshot::State s) {
  switch (s) {
    case BlockSnapshot::kActiveAllocated: return "active_allocated";
    case BlockSnapshot::kActivePendingFree: return "active_pending_free";
    case BlockSnapshot::kInactive: return "inactive";
  }
  return "unknown";
}

py::dict snapshot() {
  MemorySnapshot snap;
  {
    // Device locks are taken inside; a thread waiting for one must not
    // block Python threads that hold it and want the GIL.
    py::gil_scoped_release no_gil;
    snap = memorySnapshot();
  }
  // Dicts that get a "frames" key once every stack is symbolized in one
  // batch (symbolizing shares the work between repeated frames).
  std::vector<torch::CapturedTraceback*> tracebacks;
  std::vector<py::dict> owners;
  std::vector<size_t> owner_traceback;  // index into tracebacks, per owner
  std::unordered_map<torch::CapturedTraceback*, size_t> traceback_index;
  auto frames = [&](py::dict& d, const std::shared_ptr<c10::GatheredContext>& ctx) {
    if (ctx) {
      // A block's stack is also its alloc entry's: symbolize it once.
      auto* tb = torch::getCapturedTracebackFromContext(ctx);
      auto [it, inserted] = traceback_index.emplace(tb, tracebacks.size());
      if (inserted) tracebacks.push_back(tb);
      owner_traceback.push_back(it->second);
      owners.push_back(d);
    } else {
      d["frames"] = py::list();
    }
  };

  py::list segments;
  for (const SegmentSnapshot& seg : snap.segments) {
    py::dict d;
    d["device"] = static_cast<int>(seg.device);
    d["address"] = seg.address;
    d["total_size"] = seg.totalSize;
    d["allocated_size"] = seg.allocatedSize;
    d["active_size"] = seg.activeSize;
    d["requested_size"] = seg.requestedSize;
    d["stream"] = seg.stream;
    d["segment_type"] = seg.small ? "small" : "large";
    d["segment_pool_id"] = py::make_tuple(0, 0);
    d["is_expandable"] = false;
    frames(d, seg.context);
    py::list blocks;
    uintptr_t address = seg.address;
    for (const BlockSnapshot& b : seg.blocks) {
      py::dict bd;
      bd["address"] = address;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested;
      bd["state"] = stateName(b.state);
      frames(bd, b.context);
      blocks.append(bd);
      address += b.size;
    }
    d["blocks"] = blocks;
    segments.append(d);
  }

  py::list traces;
  for (const auto& device_trace : snap.deviceTraces) {
    py::list entries;
    for (const TraceEntry& e : device_trace) {
      py::dict d;
      d["action"] = actionName(e.action);
      // As CUDA: an out-of-memory entry says how much the device had free.
      d[e.action == TraceEntry::kOom ? "device_free" : "addr"] = e.addr;
      d["size"] = e.size;
      d["stream"] = e.stream;
      d["time_us"] = e.timeUs;
      frames(d, e.context);
      entries.append(d);
    }
    traces.append(entries);
  }

  // One symbolization for every stack: frames shared between stacks become
  // the same dict objects, and a stack shared by several owners the same
  // list (as in CUDA's snapshot).
  const torch::SymbolizedTracebacks symbolized = torch::symbolize(tracebacks);
  std::vector<py::dict> frame_dicts;
  frame_dicts.reserve(symbolized.all_frames.size());
  for (const auto& f : symbolized.all_frames) {
    py::dict d;
    d["filename"] = f.filename;
    d["line"] = f.lineno;
    d["name"] = f.funcname;
    frame_dicts.push_back(std::move(d));
  }
  std::vector<py::list> stacks;
  stacks.reserve(symbolized.tracebacks.size());
  for (const auto& traceback : symbolized.tracebacks) {
    py::list stack;
    for (uint64_t index : traceback) stack.append(frame_dicts.at(index));
    stacks.push_back(std::move(stack));
  }
  for (size_t i = 0; i < owners.size(); ++i) owners[i]["frames"] = stacks.at(owner_traceback[i]);

  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = traces;
  return out;
}

}  // namespace

void registerMemoryBindings(py::module& m) {
  setPythonStackProbe(&threadKnownToPython);
  m.def("_memory_record_history", &recordHistory, py::arg("enabled"), py::arg("context"),
        py::arg("stacks"), py::arg("max_entries"), py::arg("clear_history"),
        py::arg("skip_actions"));
  m.def("_memory_snapshot", &snapshot);
}

}  // namespace torchneuron
