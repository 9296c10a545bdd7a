// torchneuron._C bindings of the c10d backend: the ProcessGroupNeuron class,
// a subclass of torch's c10d Backend (so torch.distributed takes it as any
// backend). Registered on first use, after torch.distributed has registered
// the Backend class this one derives from.
#include "distributed/ProcessGroupNeuron.h"

#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>

namespace py = pybind11;

namespace torchneuron {

void registerDistributedBindings(py::module& m) {
  m.def("_init_distributed", [m]() mutable {
    if (py::hasattr(m, "ProcessGroupNeuron")) return;
    py::module::import("torch._C._distributed_c10d");
    using distributed::ProcessGroupNeuron;
    py::class_<ProcessGroupNeuron, c10d::Backend, c10::intrusive_ptr<ProcessGroupNeuron>>(
        m, "ProcessGroupNeuron",
        "The neuron c10d backend: collectives on neuron tensors as device work, carried by the "
        "Gloo process group `transport`.")
        .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& transport, int rank, int size,
                         const c10::intrusive_ptr<c10d::Store>& store,
                         std::chrono::milliseconds timeout) {
               return c10::make_intrusive<ProcessGroupNeuron>(transport, rank, size, store,
                                                              timeout);
             }),
             py::arg("transport"), py::arg("rank"), py::arg("size"), py::arg("store"),
             py::arg("timeout"),
             // The ranks meet through the store here: other Python threads go on.
             py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("transport", &ProcessGroupNeuron::transport)
        .def_property_readonly("agreement", &ProcessGroupNeuron::agreementPath,
                               "How the ranks check a collective's arguments agree: 'shared "
                               "memory', 'transport' or 'off' (TORCHNEURON_DIST_CHECK=0).")
        .def_property_readonly("data_path", &ProcessGroupNeuron::dataPath,
                               "How collectives' data moves between the ranks: 'shared memory' "
                               "(all ranks on this machine; the collectives it carries bit for "
                               "bit as Gloo, the rest through Gloo) or 'transport' (Gloo).")
        .def_property_readonly("shared_memory_collectives",
                               &ProcessGroupNeuron::sharedMemoryCollectives,
                               "How many collectives of this group moved their data through "
                               "shared memory so far (started on the device).");
  });
}

}  // namespace torchneuron
