// Check mode and strict mode's plain-tensor check for the DTensor handler (tensor/dispatch.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensor/dtensor.h"

namespace dtrain::tensor::detail {

// DTRAIN_DTENSOR_CHECK (check mode) and plain tensors in strict mode: every rank must take the same decision
// for an op, and a plain tensor taken as Replicate must be the same on every rank. verify() exchanges a hash
// of this rank's decision and a fingerprint of its plain tensors over the mesh (one small all_gather) and
// raises the same ValueError on every rank when they differ, naming the op and the ranks on each side.
struct DecisionCheck {
  bool decisions = false;  // check mode
  bool plains = false;     // check or strict mode: fingerprint plain tensors
  uint64_t plain = 0;      // fingerprint of the plain tensors seen (0: none)
  std::string plain_what;  // which they are

  void add_plain(const at::Tensor& t, size_t arg);
  void verify(const c10::OperatorHandle& op, const MeshPtr& mesh,
              const std::vector<std::pair<size_t, at::Tensor>>& dts, const std::string& decision) const;
};

}  // namespace dtrain::tensor::detail
