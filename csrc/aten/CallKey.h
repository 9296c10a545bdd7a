// Keys of an op call's arguments, for the asynchronous generic path's caches
// (AsyncPath.cpp): bytes appended to a std::string, compared whole.
//
// - The Meta key (keyTensor, keyValue, keyGlobals, keyAliasing, built by the
//   path as it checks each argument): everything a Meta pass's result
//   depends on, exact sizes, strides and values included.
// - The kind key (kindKey): what decides whether CPU's kernel writes the
//   layouts the Meta pass gives: dtypes, ranks, contiguity, lengths 0/1/many,
//   integer values, float values by type only.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

#include <string>
#include <vector>

namespace torchneuron {

template <class T>
void keyPut(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// dtype, where the tensor lives (device, wrapped number, CPU) and rank;
// false for an undefined tensor.
bool keyTensorHead(std::string& key, const at::Tensor& t);
// The head, then sizes and strides.
void keyTensor(std::string& key, const at::Tensor& t);
// A non-tensor argument; false when it cannot be part of a key. With
// floatsByType, a float or complex scalar counts by its type only.
bool keyValue(std::string& key, const c10::IValue& iv, bool floatsByType = false);
// Global state results depend on (default dtype, deterministic flags).
void keyGlobals(std::string& key);
// How the written tensors among stack[begin, begin + writtenArg.size())
// overlap themselves and the other arguments.
void keyAliasing(std::string& key, const std::vector<bool>& writtenArg,
                 const torch::jit::Stack& stack, size_t begin);
// The kind of the call of `op` (any identity: the path's per-op plan) with
// arguments stack[begin, begin + n).
std::string kindKey(const void* op, const std::vector<bool>& writtenArg,
                    const torch::jit::Stack& stack, size_t begin, size_t n);

}  // namespace torchneuron
