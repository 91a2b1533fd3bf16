// A user's own module, loss and data trained with dtrain's Trainer: a small MLP fitting a noisy function of
// 8 inputs, on as many ranks as `dtrain run -n N` starts, under the strategy named by the first argument
// (dp by default; zero1, zero2, zero3, ...).
//
//   dtrain run -n 2 -- ./regression zero2
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>

#include <cstdio>
#include <string>

#include "comm/init.h"
#include "train/trainer.h"

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

// Prints the loss every 50 steps on rank 0, and the parameters' sum of squares at the end.
class Report : public dtrain::train::Callback {
 public:
  explicit Report(Mlp& model) : model_(model) {}
  bool wants_loss(int64_t step) override { return step % 50 == 0; }
  void on_step_end(dtrain::train::Trainer& t, const dtrain::train::StepInfo& s) override {
    if (t.lead() && s.step % 50 == 0)
      std::printf("example: step %ld loss %.6f\n", static_cast<long>(s.step), s.loss);
  }
  void on_evaluate(dtrain::train::Trainer& t, int64_t step, double loss) override {
    if (t.lead()) std::printf("example: final held-out loss %.9g\n", loss);
  }
  void on_train_end(dtrain::train::Trainer& t) override {
    double sq = 0;
    for (const auto& p : model_->parameters()) sq += p.detach().pow(2).sum().item<double>();
    if (t.lead()) std::printf("example: parameters' sum of squares %.9g\n", sq);
  }

 private:
  Mlp& model_;
};

int main(int argc, char** argv) {
  try {
    auto world = dtrain::init();
    torch::manual_seed(0);  // the same initial weights on every rank (the Trainer also broadcasts rank 0's)
    Mlp model;
    // the data: 4096 samples of y = sin(x . a) + noise, the same on every rank
    torch::Tensor x = torch::randn({4096, 8});
    torch::Tensor a = torch::linspace(-1, 1, 8);
    torch::Tensor y = torch::sin(x.matmul(a)).unsqueeze(1) + 0.01 * torch::randn({4096, 1});
    dtrain::train::TrainerOptions o;
    o.strategy = argc > 1 ? argv[1] : "dp";
    o.steps = 200;
    o.batch = 64;
    o.lr = 1e-2;
    o.weight_decay = 0;
    o.lr_schedule = "cosine";
    o.warmup = 10;
    o.log_every = 100;
    dtrain::train::DistributedSampler sampler(3584, o.batch, /*seed=*/7);  // the first 3584 samples train
    auto batches = [&](int64_t step) -> dtrain::train::Trainer::Batch {
      const torch::Tensor idx = sampler.step_indices(step);
      return {x.index_select(0, idx), y.index_select(0, idx)};
    };
    auto loss = [&](const dtrain::train::Trainer::Batch& rows) {
      return torch::nn::functional::mse_loss(model->forward(rows[0]), rows[1]);
    };
    dtrain::train::Trainer trainer(*model, loss, batches, o, world);
    trainer.add_callback(std::make_shared<Report>(model));
    trainer.set_evaluation(  // the last 512 samples, held out
        [&](int64_t) -> dtrain::train::Trainer::Batch {
          return {x.narrow(0, 3584, 512), y.narrow(0, 3584, 512)};
        },
        1);
    trainer.fit();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example: %s\n", e.what());
    return 1;
  }
}
