// record_stream: keeps a tensor's memory from being reused until the work
// queued so far on another stream is done (DDP, FSDP2 rely on it).
#include "aten/Common.h"

#include <torch/library.h>

namespace torchneuron {
namespace {

void record_stream(at::Tensor& self, c10::Stream stream) {
  NEURON_RECORD_OP("aten::record_stream", Native);
  TORCH_CHECK(stream.device_type() == kNeuron, "record_stream: expected a neuron stream, got ",
              stream);
  getDeviceAllocator()->recordStream(self.storage().data_ptr(), stream);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("record_stream", TORCH_FN(record_stream));
}

}  // namespace torchneuron
