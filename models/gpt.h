// A GPT-style decoder written with plain torch::nn modules and nothing of dtrain: the model the DTensor
// end-to-end tests, the benchmarks and the main job train. Token + position embedding, pre-LayerNorm blocks
// of causal self-attention and a GELU MLP 4x wide, a final LayerNorm and an output head tied to the token
// embedding. Attention calls at::scaled_dot_product_attention on [batch, heads, seq, head_dim] tensors.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <string>

#include "nn/activation_checkpointable.h"

namespace dtrain::models {

struct GPTConfig {
  int64_t vocab_size = 256;
  int64_t block_size = 64;  // longest sequence (rows of the position embedding)
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t n_embd = 64;
  double dropout = 0.0;  // off by default, so that runs are deterministic
  uint64_t seed =
      1234;  // weights: normal(0, 0.02) from a generator seeded with this; biases 0, LayerNorm 1/0

  // Throws ValueError naming the field when the configuration cannot build a model.
  void validate() const;
};

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const GPTConfig& c);
  at::Tensor forward(const at::Tensor& x);  // [B, T, C] -> [B, T, C]

  int64_t n_head;    // of the whole model (a tensor-parallel rank holds some of them)
  int64_t head_dim;  // n_embd / n_head
  double dropout;
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, proj{nullptr};
  torch::nn::Dropout resid_drop{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

struct MLPImpl : torch::nn::Module {
  explicit MLPImpl(const GPTConfig& c);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Linear fc{nullptr}, proj{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(MLP);

// Opts in to activation checkpointing (nn/activation_checkpointable.h): its body runs through run_body().
struct BlockImpl : torch::nn::Module, nn::ActivationCheckpointable {
  explicit BlockImpl(const GPTConfig& c);
  at::Tensor forward(const at::Tensor& x);

  nn::BlockBody body;  // the block's computation: x + attn(ln1(x)), then + mlp(ln2(.))

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

// The GPT's initial values (see GPTConfig::seed), one parameter at a time, in registration order
// (named_parameters()): the constructor applies it to every parameter; a model built on the meta device for
// ZeRO-3 (parallel/zero.h) gets the same values through it, one parameter at a time.
struct GPTInit {
  explicit GPTInit(uint64_t seed);
  void operator()(const std::string& name, at::Tensor& t);
  at::Generator gen;
};

struct GPTImpl : torch::nn::Module {
  explicit GPTImpl(const GPTConfig& c);
  // idx: [B, T] token ids (int64), T <= block_size. Returns logits [B, T, vocab_size].
  at::Tensor forward(const at::Tensor& idx);
  // Mean cross entropy of next-token prediction: logits of idx against targets [B, T].
  at::Tensor loss(const at::Tensor& idx, const at::Tensor& targets);

  GPTConfig config;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(GPT);

}  // namespace dtrain::models
