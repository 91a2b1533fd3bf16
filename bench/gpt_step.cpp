// One GPT training step (forward, backward, AdamW) with DTensor parameters on a 1-rank mesh, against the same
// step on plain tensors, in one process: what the DTensor layer costs when nothing needs to move. Layouts:
// everything Replicate (the handler's local fast path), and the batch Shard(0) (every op through its sharding
// rule). Prints one JSON line per layout; bench/run_gpt_step.sh makes the RESULTS.md table.
//   usage: gpt_step [steps] [n_layer] [n_embd] [batch] [seq]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "comm/factory.h"
#include "models/gpt.h"
#include "tensor/distribute_module.h"
#include "tensor/dtensor.h"

using namespace dtrain;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  models::GPTConfig cfg;
  cfg.n_layer = argc > 2 ? std::atoi(argv[2]) : 4;
  cfg.n_embd = argc > 3 ? std::atoi(argv[3]) : 256;
  int64_t batch = argc > 4 ? std::atoi(argv[4]) : 8;
  cfg.block_size = argc > 5 ? std::atoi(argv[5]) : 128;
  cfg.n_head = 8;
  cfg.vocab_size = 512;
  at::set_num_threads(1);
  auto world = comm::create_backend("gloo", RankInfo{}, std::chrono::seconds(30));
  auto mesh = std::make_shared<const mesh::DeviceMesh>(world, std::vector<int64_t>{1},
                                                       std::vector<std::string>{"dp"});
  at::Tensor tokens = (at::arange(batch * (cfg.block_size + 1), at::kLong) * 7 + 3) % cfg.vocab_size;
  tokens = tokens.view({batch, cfg.block_size + 1});
  at::Tensor idx = tokens.narrow(1, 0, cfg.block_size).contiguous();
  at::Tensor targets = tokens.narrow(1, 1, cfg.block_size).contiguous();

  auto step_fn = [](models::GPT& model, torch::optim::AdamW& opt, const at::Tensor& x, const at::Tensor& y) {
    return std::function<void()>([&model, &opt, x, y] {
      opt.zero_grad();
      model->loss(x, y).backward();
      opt.step();
    });
  };
  // Three runs of the same model: plain, DTensor with everything Replicate, DTensor with the batch Shard(0).
  // Their steps alternate (plain, R, S(0), plain, ...) so that a slow moment of the machine hits all alike.
  const char* names[] = {"plain", "params R, batch R", "params R, batch S(0)"};
  std::vector<models::GPT> models_;
  std::vector<std::unique_ptr<torch::optim::AdamW>> opts;
  std::vector<std::function<void()>> steps_fn;
  for (int v = 0; v < 3; ++v) {
    models_.emplace_back(cfg);
    if (v > 0) tensor::distribute_module(*models_.back(), mesh);
  }
  for (int v = 0; v < 3; ++v) {
    opts.push_back(
        std::make_unique<torch::optim::AdamW>(models_[v]->parameters(), torch::optim::AdamWOptions(1e-4)));
    at::Tensor x = idx, y = targets;
    if (v > 0) {
      tensor::Placement p = v == 1 ? tensor::Replicate() : tensor::Shard(0);
      x = tensor::distribute_tensor(idx, mesh, {p});
      y = tensor::distribute_tensor(targets, mesh, {p});
    }
    steps_fn.push_back(step_fn(models_[v], *opts[v], x, y));
  }
  std::vector<std::vector<double>> times(3);
  for (int i = 0; i < steps + 2; ++i) {
    for (int v = 0; v < 3; ++v) {
      auto t0 = Clock::now();
      steps_fn[v]();
      if (i >= 2) times[v].push_back(std::chrono::duration<double>(Clock::now() - t0).count() * 1e3);
    }
  }
  auto median = [](std::vector<double> t) {
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double plain_ms = median(times[0]);
  for (int v = 1; v < 3; ++v) {
    double ms = median(times[v]);
    nlohmann::json j{{"layout", names[v]},
                     {"plain_ms", plain_ms},
                     {"dtensor_ms", ms},
                     {"ratio", ms / plain_ms},
                     {"model", {{"n_layer", cfg.n_layer}, {"n_embd", cfg.n_embd}, {"vocab", cfg.vocab_size}}},
                     {"batch", batch},
                     {"seq", cfg.block_size},
                     {"steps", steps}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}
