// KernelArgs.cpp: see KernelArgs.h.
#include "aten/KernelArgs.h"

#include <ATen/core/List.h>

namespace torchneuron {

c10::IValue rebuild(const ArgSlot& slot, CpuStorages& storages) {
  switch (slot.kind) {
    case ArgSlot::kValue: return slot.value;
    case ArgSlot::kTensor: return slot.tensors[0]->cpu(storages);
    case ArgSlot::kTensorList: {
      c10::List<at::Tensor> list;
      list.reserve(slot.tensors.size());
      for (size_t i = 0; i < slot.tensors.size(); ++i)
        list.push_back(slot.tensors[i] ? slot.tensors[i]->cpu(storages) : slot.others[i].toTensor());
      return list;
    }
    case ArgSlot::kOptTensorList: {
      c10::List<std::optional<at::Tensor>> list;
      list.reserve(slot.tensors.size());
      for (size_t i = 0; i < slot.tensors.size(); ++i) {
        if (slot.tensors[i]) list.push_back(slot.tensors[i]->cpu(storages));
        else if (slot.others[i].isNone()) list.push_back(std::nullopt);
        else list.push_back(slot.others[i].toTensor());
      }
      return list;
    }
  }
  return slot.value;
}

}  // namespace torchneuron
