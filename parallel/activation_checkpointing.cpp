// Activation checkpointing; see activation_checkpointing.h.
#include "parallel/activation_checkpointing.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <atomic>
#include <mutex>

#include "core/error.h"
#include "parallel/tensor_parallel.h"

namespace dtrain::parallel {

namespace {

std::atomic<int64_t> g_recomputations{0};

struct Checkpoint : torch::autograd::Function<Checkpoint> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const nn::BlockBody* body, const at::Tensor& x,
                                                at::TensorList params) {
    ctx->saved_data["body"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(body));
    ctx->saved_data["params"] = params.vec();
    {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      ctx->saved_data["rng"] = gen.get_state();
    }
    ctx->save_for_backward({x});
    at::Tensor y;
    {
      at::NoGradGuard no_grad;
      y = (*body)(x);
    }
    return {y};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* body =
        reinterpret_cast<const nn::BlockBody*>(static_cast<intptr_t>(ctx->saved_data["body"].toInt()));
    const std::vector<at::Tensor> params = ctx->saved_data["params"].toTensorVector();
    const at::Tensor x = ctx->get_saved_variables()[0];
    at::Tensor x2 = x.detach().requires_grad_(x.requires_grad());
    at::Tensor y;
    {
      // the forward's random state for the recomputation (dropout draws the same masks), then back
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      at::Tensor now;
      {
        std::lock_guard<std::mutex> lock(gen.mutex());
        now = gen.get_state();
        gen.set_state(ctx->saved_data["rng"].toTensor());
      }
      at::AutoGradMode on(true);
      y = (*body)(x2);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(now);
    }
    ++g_recomputations;
    std::vector<at::Tensor> inputs;
    std::vector<int> where;  // position in the result (1: x, 2 + k: params[k])
    if (x2.requires_grad()) {
      inputs.push_back(x2);
      where.push_back(1);
    }
    for (size_t k = 0; k < params.size(); ++k) {
      if (!params[k].requires_grad()) continue;
      inputs.push_back(params[k]);
      where.push_back(static_cast<int>(2 + k));
    }
    torch::autograd::variable_list out(2 + params.size());
    if (inputs.empty() || !y.requires_grad()) return out;
    auto g = torch::autograd::grad({y}, inputs, {grads[0]}, /*retain_graph=*/false, /*create_graph=*/false,
                                   /*allow_unused=*/true);
    for (size_t k = 0; k < g.size(); ++k) out[where[k]] = g[k];
    return out;
  }
};

}  // namespace

at::Tensor recompute_in_backward(const nn::BlockBody& body, const at::Tensor& x,
                                 const std::vector<at::Tensor>& params) {
  bool any = x.requires_grad();
  for (const auto& p : params) any = any || p.requires_grad();
  if (!at::GradMode::is_enabled() || !any) return body(x);
  return Checkpoint::apply(&body, x, at::TensorList(params))[0];
}

void checkpoint_activations(torch::nn::Module& module, const std::vector<std::string>& patterns) {
  std::vector<nn::ActivationCheckpointable*> chosen;
  for (const auto& pattern : patterns) {
    int matched = 0;
    std::string names;
    for (const auto& item : module.named_modules("", /*include_self=*/false)) {
      names += str_cat(names.empty() ? "" : ", ", item.key());
      if (!tp_pattern_matches(pattern, item.key())) continue;
      ++matched;
      auto* c = dynamic_cast<nn::ActivationCheckpointable*>(item.value().get());
      if (c == nullptr) {
        throw ValueError(str_cat("activation checkpointing: pattern '", pattern, "' names module '",
                                 item.key(),
                                 "', which cannot recompute its activations: it must derive "
                                 "nn::ActivationCheckpointable (nn/activation_checkpointable.h) and run its "
                                 "body through run_body() in its forward."));
      }
      chosen.push_back(c);
    }
    if (matched == 0) {
      throw ValueError(str_cat("activation checkpointing: pattern '", pattern,
                               "' names no module. The module's submodules: ", names, "."));
    }
  }
  for (auto* c : chosen) c->set_body_runner(&recompute_in_backward);
}

int64_t activation_recomputations() { return g_recomputations.load(); }

}  // namespace dtrain::parallel
