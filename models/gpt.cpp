#include "models/gpt.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>

#include "core/error.h"

namespace dtrain::models {

namespace {

// A Linear layer as PyTorch's Python runs it: aten::linear, which folds a [B, T, C] input into one addmm with
// the bias fused. (torch::nn::Linear's C++ forward runs matmul and then adds the bias for inputs above 2-d:
// one more op per layer forward and backward; bench/RESULTS.md, "One process against PyTorch, op by op".)
at::Tensor dense(const torch::nn::Linear& layer, const at::Tensor& x) {
  return at::linear(x, layer->weight, layer->bias);
}

}  // namespace

void GPTConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    if (v <= 0) throw ValueError(str_cat("model.", name, " = ", v, " is not positive. Set it to 1 or more."));
  };
  positive("vocab_size", vocab_size);
  positive("block_size", block_size);
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_embd", n_embd);
  if (n_embd % n_head != 0) {
    throw ValueError(str_cat("model.n_embd = ", n_embd, " is not a multiple of model.n_head = ", n_head,
                             ". Choose n_embd = n_head * head_dim."));
  }
  if (dropout < 0 || dropout >= 1) {
    throw ValueError(str_cat("model.dropout = ", dropout, " is outside [0, 1). Use 0 to turn it off."));
  }
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& c)
    : n_head(c.n_head), head_dim(c.n_embd / c.n_head), dropout(c.dropout) {
  // Separate q, k and v projections (rather than one fused [3C, C]) so that each can be column-sharded by
  // heads on its own.
  q = register_module("q", torch::nn::Linear(c.n_embd, c.n_embd));
  k = register_module("k", torch::nn::Linear(c.n_embd, c.n_embd));
  v = register_module("v", torch::nn::Linear(c.n_embd, c.n_embd));
  proj = register_module("proj", torch::nn::Linear(c.n_embd, c.n_embd));
  resid_drop = register_module("resid_drop", torch::nn::Dropout(c.dropout));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  // Shapes come from the projections, not from x or the configuration, so that the block runs unchanged
  // under tensor parallelism (q, k and v give this rank's heads) and sequence parallelism (x holds part of
  // the sequence, the projections all of it).
  auto heads = [&](const at::Tensor& t) {
    return t.view({t.size(0), t.size(1), t.size(2) / head_dim, head_dim}).transpose(1, 2);
  };
  at::Tensor y =
      at::scaled_dot_product_attention(heads(dense(q, x)), heads(dense(k, x)), heads(dense(v, x)),
                                       std::nullopt, is_training() ? dropout : 0.0, /*is_causal=*/true);
  // [B, H, T, hd] -> [B, T, H * hd]
  y = y.transpose(1, 2).contiguous();
  y = y.view({y.size(0), y.size(1), y.size(2) * head_dim});
  return resid_drop(dense(proj, y));
}

MLPImpl::MLPImpl(const GPTConfig& c) {
  fc = register_module("fc", torch::nn::Linear(c.n_embd, 4 * c.n_embd));
  proj = register_module("proj", torch::nn::Linear(4 * c.n_embd, c.n_embd));
  drop = register_module("drop", torch::nn::Dropout(c.dropout));
}

at::Tensor MLPImpl::forward(const at::Tensor& x) { return drop(dense(proj, at::gelu(dense(fc, x)))); }

BlockImpl::BlockImpl(const GPTConfig& c) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  attn = register_module("attn", CausalSelfAttention(c));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  mlp = register_module("mlp", MLP(c));
  body = [this](const at::Tensor& x) {
    at::Tensor h = x + attn(ln1(x));
    return h + mlp(ln2(h));
  };
}

at::Tensor BlockImpl::forward(const at::Tensor& x) { return run_body(body, x, parameters()); }

GPTImpl::GPTImpl(const GPTConfig& c) : config(c) {
  c.validate();
  wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
  drop = register_module("drop", torch::nn::Dropout(c.dropout));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    blocks.push_back(register_module("h" + std::to_string(i), Block(c)));
  }
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  // The output head is wte itself (tied): no parameter of its own.
  GPTInit init(c.seed);
  for (auto& p : named_parameters()) init(p.key(), p.value());
}

GPTInit::GPTInit(uint64_t seed) : gen(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

void GPTInit::operator()(const std::string& name, at::Tensor& t) {
  at::NoGradGuard no_grad;
  if (name.find("ln") != std::string::npos) {
    t.fill_(name.size() >= 6 && name.substr(name.size() - 6) == "weight" ? 1.0 : 0.0);
  } else if (name.substr(name.size() - 4) == "bias") {
    t.zero_();
  } else {
    t.normal_(0.0, 0.02, gen);
  }
}

at::Tensor GPTImpl::forward(const at::Tensor& idx) {
  const int64_t T = idx.size(1);
  if (T > config.block_size) {
    throw ValueError(str_cat("GPT: sequence length ", T, " exceeds model.block_size = ", config.block_size,
                             ". Shorten the sequence or raise block_size."));
  }
  at::Tensor pos = at::arange(T, idx.options().dtype(at::kLong));
  at::Tensor x = drop(wte(idx) + wpe(pos));
  for (auto& b : blocks) x = b(x);
  return torch::nn::functional::linear(ln_f(x), wte->weight);
}

at::Tensor GPTImpl::loss(const at::Tensor& idx, const at::Tensor& targets) {
  at::Tensor logits = forward(idx);
  // (the logits' own last size: under a loss-parallel plan each rank holds its part of the vocabulary)
  return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), targets.view({-1}));
}

}  // namespace dtrain::models
