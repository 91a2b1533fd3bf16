// Mixed precision with fp32 master weights (DESIGN §5): the module computes in bf16 or fp16, the optimizer
// steps fp32 copies of its parameters (the masters), and fp16 scales the loss (optim::LossScaler). Composes
// with every strategy of parallel::parallelize: the masters are those of the tensors the optimizer steps
// (the module's parameters under dp, this rank's shards under ZeRO, tensor-parallel parts with tp > 1).
//
// Use: convert the module (`module->to(at::kBFloat16)`), build it with parallelize(..., mp.wrap(make)) so
// that the optimizer steps the masters, then per step:
//   (loss * mp.loss_scale()).backward();        // each micro-step
//   if (mp.unscale(*par)) par->step([&] { mp.copy_back(); });  // false: an inf or nan, the step is skipped
//   else par->zero_grad();
// unscale() moves the reduced 16-bit gradients into the masters' fp32 gradients (divided by the scale) and
// decides, the same on every rank, whether any rank's gradients hold an inf or a nan (one all-reduce of one
// number); the scaler reacts. optim::clip_grad_norm after unscale() clips the masters' gradients.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "optim/loss_scaler.h"
#include "parallel/parallelize.h"

namespace dtrain::optim {

enum class Precision { kFp32, kBf16, kFp16 };
// "fp32", "bf16" or "fp16" (case-insensitive); ValueError listing them otherwise.
Precision parse_precision(const std::string& name);
const char* to_string(Precision p);
at::ScalarType compute_dtype(Precision p);

class MixedPrecision {
 public:
  explicit MixedPrecision(Precision precision, LossScalerOptions scaler = {});
  // ValueError for a configuration this cannot serve (a strategy name not in the names table).
  static void check(Precision precision, const parallel::ParallelConfig& config);
  // A factory that makes fp32 masters of the tensors it is given and hands them to `make`.
  parallel::OptimizerFactory wrap(parallel::OptimizerFactory make);
  double loss_scale() const { return precision_ == Precision::kFp16 ? scaler_.scale() : 1.0; }
  // See above. fp32: nothing to move, always true.
  bool unscale(parallel::Parallelized& par);
  // The masters' new values into the 16-bit parameters (or shards: before ZeRO gathers them, see step()).
  void copy_back();
  const LossScaler& scaler() const { return scaler_; }
  // The fp32 masters of the tensors the optimizer factory was given, in the same order (empty under fp32).
  const std::vector<at::Tensor>& masters() const { return masters_; }
  // A checkpoint's scaler state and skipped-step count (bf16 counts its own).
  void restore(const LossScaler::State& scaler, int64_t skipped);
  // Steps skipped for an inf or nan.
  int64_t skipped() const { return precision_ == Precision::kFp16 ? scaler_.skipped() : bf16_skipped_; }
  Precision precision() const { return precision_; }
  // Bytes of this rank's fp32 masters (0 under fp32).
  int64_t master_bytes() const;
  // Seconds spent so far in the bookkeeping outside the model's own compute: unscale() (the gradients cast
  // into the masters, the inf/nan check and its all-reduce, the scaler) and copy_back() (the masters cast
  // into the 16-bit parameters).
  double bookkeeping_seconds() const { return bookkeeping_s_; }

 private:
  Precision precision_;
  LossScaler scaler_;
  std::vector<at::Tensor> params_, masters_;
  int64_t bf16_skipped_ = 0;
  double bookkeeping_s_ = 0;
};

}  // namespace dtrain::optim
