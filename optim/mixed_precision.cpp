// Mixed precision; see mixed_precision.h.
#include "optim/mixed_precision.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "comm/comm_log.h"
#include "core/error.h"

namespace dtrain::optim {

Precision parse_precision(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "fp32" || n == "float32") return Precision::kFp32;
  if (n == "bf16" || n == "bfloat16") return Precision::kBf16;
  if (n == "fp16" || n == "float16" || n == "half") return Precision::kFp16;
  throw ValueError(str_cat("precision '", name, "' is not one of fp32, bf16, fp16."));
}

const char* to_string(Precision p) {
  return p == Precision::kFp32 ? "fp32" : p == Precision::kBf16 ? "bf16" : "fp16";
}

at::ScalarType compute_dtype(Precision p) {
  return p == Precision::kFp32 ? at::kFloat : p == Precision::kBf16 ? at::kBFloat16 : at::kHalf;
}

MixedPrecision::MixedPrecision(Precision precision, LossScalerOptions scaler)
    : precision_(precision), scaler_(scaler) {}

void MixedPrecision::check(Precision precision, const parallel::ParallelConfig& config) {
  if (precision == Precision::kFp32) return;
  parallel::parse_strategy(config.strategy);  // (a bad name: the names table's message)
}

parallel::OptimizerFactory MixedPrecision::wrap(parallel::OptimizerFactory make) {
  return [this, make](std::vector<at::Tensor> tensors) {
    if (precision_ == Precision::kFp32) return make(std::move(tensors));
    params_ = tensors;
    masters_.clear();
    for (const auto& t : tensors) {
      masters_.push_back(t.detach().to(at::kFloat).clone().requires_grad_(t.requires_grad()));
    }
    return make(masters_);
  };
}

bool MixedPrecision::unscale(parallel::Parallelized& par) {
  if (precision_ == Precision::kFp32) return true;
  par.finish_gradients();
  auto start = std::chrono::steady_clock::now();
  at::NoGradGuard no_grad;
  // each gradient cast into its master's (a copy; none when the buckets already reduce in fp32), then one
  // fused pass (libtorch's AMP kernel, as GradScaler's) divides them all by the scale and notes any inf/nan
  at::Tensor bad = at::zeros({1}, at::kFloat);  // any inf or nan on this rank
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor g = params_[i].grad();
    if (!g.defined()) {
      masters_[i].mutable_grad() = at::Tensor();
      continue;
    }
    at::Tensor m = g.scalar_type() == at::kFloat ? g : g.to(at::kFloat);
    masters_[i].mutable_grad() = m;
    grads.push_back(m);
    params_[i].mutable_grad().reset();  // as the optimizer's zero_grad would (the masters hold them now)
  }
  if (!grads.empty()) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, bad, at::full({1}, 1.0 / loss_scale(), at::kFloat));
  }
  bookkeeping_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // (the check's all-reduce is communication, in CommLog: it waits for the slowest rank)
  comm::AllReduceOptions o;
  o.op = comm::ReduceOp::kMax;
  {
    comm::CommCause cause("mixed precision overflow check");
    par.world()->all_reduce(bad, o)->wait();
  }
  start = std::chrono::steady_clock::now();
  const bool overflow = bad.item<float>() > 0;
  if (precision_ == Precision::kFp16) {
    scaler_.update(overflow);
  } else if (overflow) {  // bf16: no scale to lower; the step is skipped all the same
    ++bf16_skipped_;
  }
  if (overflow) {
    for (auto& m : masters_) m.mutable_grad() = at::Tensor();
  }
  bookkeeping_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return !overflow;
}

int64_t MixedPrecision::master_bytes() const {
  int64_t b = 0;
  for (const auto& m : masters_) b += m.numel() * m.element_size();
  return b;
}

void MixedPrecision::copy_back() {
  const auto start = std::chrono::steady_clock::now();
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].detach().copy_(masters_[i]);
  bookkeeping_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void MixedPrecision::restore(const LossScaler::State& scaler, int64_t skipped) {
  if (precision_ == Precision::kFp16) {
    scaler_.restore(scaler);
  } else {
    bf16_skipped_ = skipped;
  }
}

}  // namespace dtrain::optim
