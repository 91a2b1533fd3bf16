// The training run; see train_gpt.h.
#include "train/train_gpt.h"

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "comm/init.h"
#include "core/error.h"
#include "mesh/device_mesh.h"
#include "tensor/comm_log.h"
#include "tensor/distribute_module.h"
#include "tensor/redistribute.h"
#include "tensor/shard_math.h"
#include "train/text_data.h"

namespace dtrain::train {

using namespace dtrain::tensor;

Placement megatron_placement(const std::string& name) {
  switch (models::megatron_split(name)) {
    case models::MegatronSplit::kRows:
      return Shard(0);
    case models::MegatronSplit::kColumns:
      return Shard(1);
    case models::MegatronSplit::kWhole:
      break;
  }
  return Replicate();
}

int train_gpt(const TrainOptions& o) {
  o.model.validate();
  if (o.log_every < 1) {
    throw ValueError(
        str_cat("train: --log-every ", o.log_every, " must be at least 1. Use e.g. --log-every 20."));
  }
  // Batches beyond this machine's reach fail here, naming the flag, rather than deep inside libtorch.
  if (o.batch > (int64_t{1} << 20) || o.batch * (o.model.block_size + 1) > (int64_t{1} << 30)) {
    throw ValueError(str_cat("train: --batch ", o.batch, " sequences of ", o.model.block_size + 1,
                             " tokens is more than 2^30 tokens per step. Use a smaller --batch or --seq."));
  }
  auto world = dtrain::init();
  const int64_t ws = world->group_size();
  if (o.tp < 1 || ws % o.tp != 0) {
    throw ValueError(str_cat("train: --tp ", o.tp, " does not divide the world size ", ws,
                             ". Choose a divisor of ", ws, "."));
  }
  if (o.batch < 1 || o.steps < 1) {
    throw ValueError(str_cat("train: --batch ", o.batch, " and --steps ", o.steps, " must be positive."));
  }
  const int64_t dp = ws / o.tp;
  auto mesh = std::make_shared<const mesh::DeviceMesh>(world, std::vector<int64_t>{dp, o.tp},
                                                       std::vector<std::string>{"dp", "tp"});
  const bool lead = world->group_rank() == 0;
  TextCorpus corpus = load_text(o.data);
  models::GPTConfig cfg = o.model;
  cfg.vocab_size = 256;  // bytes
  cfg.seed = o.seed;
  models::GPT gpt(cfg);
  int64_t n_params = 0;
  for (const auto& p : gpt->parameters()) n_params += p.numel();
  distribute_module(*gpt, mesh, [](const std::string& name, const at::Tensor&) -> Placements {
    return {Replicate(), megatron_placement(name)};
  });
  torch::optim::AdamW opt(gpt->parameters(), torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
  if (lead) {
    std::printf("dtrain train: GPT %ld layers x %ld wide, %ld heads, %ld parameters; %s\n",
                static_cast<long>(cfg.n_layer), static_cast<long>(cfg.n_embd), static_cast<long>(cfg.n_head),
                static_cast<long>(n_params), corpus.source.c_str());
    std::printf(
        "dtrain train: %ld ranks as mesh (dp=%ld, tp=%ld), global batch %ld x %ld tokens, %ld steps\n",
        static_cast<long>(ws), static_cast<long>(dp), static_cast<long>(o.tp), static_cast<long>(o.batch),
        static_cast<long>(cfg.block_size), static_cast<long>(o.steps));
  }
  // This rank's rows of a global batch (the same windows on every rank; no communication).
  const Placements data{Shard(0), Replicate()};
  auto to_dtensor = [&](const at::Tensor& full) {
    return from_local(local_block(full, mesh->shape(), data, mesh->coordinate()).contiguous(), mesh, data,
                      full.sizes().vec());
  };
  auto batch_at = [&](const at::Tensor& tokens, int64_t step) {
    at::Tensor w = sample_windows(tokens, o.batch, cfg.block_size, o.seed, step);
    return std::make_pair(to_dtensor(w.narrow(1, 0, cfg.block_size).contiguous()),
                          to_dtensor(w.narrow(1, 1, cfg.block_size).contiguous()));
  };
  auto t0 = std::chrono::steady_clock::now();
  double first_loss = 0, last_loss = 0;
  std::string last_step_comm;
  for (int64_t step = 1; step <= o.steps; ++step) {
    auto [x, y] = batch_at(corpus.train, step);
    CommLog::instance().clear();  // the log then holds one step
    opt.zero_grad();
    at::Tensor loss = gpt->loss(x, y);
    loss.backward();
    opt.step();
    if (step == o.steps) last_step_comm = CommLog::instance().summary();
    if (step == 1 || step % o.log_every == 0 || step == o.steps) {
      double l = full_tensor(loss.detach()).item().toDouble();
      if (step == 1) first_loss = l;
      last_loss = l;
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (lead) {
        std::printf("step %5ld  loss %.4f  %.0f tokens/s\n", static_cast<long>(step), l,
                    static_cast<double>(step * o.batch * cfg.block_size) / secs);
        std::fflush(stdout);
      }
    }
  }
  double val = 0;
  {
    at::NoGradGuard no_grad;
    for (int64_t b = 0; b < o.eval_batches; ++b) {
      auto [x, y] = batch_at(corpus.val, -1 - b);
      val += full_tensor(gpt->loss(x, y)).item().toDouble();
    }
  }
  if (lead) {
    std::printf(
        "dtrain train: loss %.4f -> %.4f over %ld steps; validation loss %.4f (uniform guess: %.4f)\n",
        first_loss, last_loss, static_cast<long>(o.steps), val / static_cast<double>(o.eval_batches),
        std::log(256.0));
    std::printf("communication of the last step (forward, backward, AdamW), by the op that caused it:\n%s",
                last_step_comm.empty() ? "  none\n" : last_step_comm.c_str());
  }
  world->barrier()->wait();
  return 0;
}

}  // namespace dtrain::train
