// Agreement: before a collective moves data, the ranks check that they all
// called the same operation on the same kind of tensors.
//
// Gloo trusts its callers: ranks that pass different sizes make its I/O
// thread throw, which terminates the process. So each neuron collective
// first all-reduces (MAX) a small signature and its negation through the
// transport, which yields every component's maximum and minimum across the
// group; any difference is a mismatch, raised as an error that names the
// collective and the disagreeing field on every rank, before any transfer
// starts. One small all-reduce per collective, or, when the whole group is
// on this machine, an exchange through shared memory (AgreementBoard.h);
// TORCHNEURON_DIST_CHECK=0 turns the check off.
#pragma once

#include <ATen/core/Tensor.h>
#include "distributed/AgreementBoard.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>

#include <cstdint>
#include <string>
#include <vector>

namespace torchneuron::distributed {

struct Signature {
  std::vector<std::string> fields;  // what each value is ("elements", "dtype", ...)
  std::vector<int64_t> values;

  void add(const char* field, int64_t value) {
    fields.emplace_back(field);
    values.push_back(value);
  }
};

// The common signature: the operation, its root (or -1), the tensors' dtype,
// count and total elements.
Signature signatureOf(int opType, int64_t root, const std::vector<at::Tensor>& tensors);

// Runs on the executor (the start item): raises if the ranks disagree.
// Through `board` when there is one, else through the transport.
void agree(c10d::Backend& transport, AgreementBoard* board, std::chrono::milliseconds timeout,
           const char* op, const Signature& signature);

}  // namespace torchneuron::distributed
