// The GPT end-to-end suite (see worker_suites.h): models::GPT, unmodified, trained one step (forward,
// backward, AdamW) on DTensors in three layouts, against the same model on plain tensors in this process.
#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <cstdio>
#include <string>

#include "apps/dtrain/gpt/train_gpt.h"
#include "comm/comm_log.h"
#include "core/error.h"
#include "mesh/device_mesh.h"
#include "models/gpt.h"
#include "tensor/detail/dtensor_meta.h"
#include "tensor/distribute_module.h"
#include "tests/worker_checks.h"
#include "tests/worker_suites.h"

namespace dtrain::test {

namespace {

using namespace dtrain::tensor;

struct Layout {
  std::string name;
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> axes;  // "dp": batch Shard(0), parameters Replicate; "tp": train::gpt_tp_placement
};

void check_layout(const comm::BackendPtr& world, const Layout& layout, const models::GPTConfig& cfg,
                  int64_t batch) {
  auto mesh = std::make_shared<const mesh::DeviceMesh>(world, layout.mesh_shape, layout.axes);
  // Token data: the same on every rank (a deterministic function of the position).
  const int64_t T = cfg.block_size;
  at::Tensor tokens = (at::arange(batch * (T + 1), at::kLong) * 7 + 3) % cfg.vocab_size;
  tokens = tokens.view({batch, T + 1});
  at::Tensor idx = tokens.narrow(1, 0, T).contiguous(), targets = tokens.narrow(1, 1, T).contiguous();

  models::GPT ref(cfg), dist(cfg);  // same seed: same weights
  distribute_module(*dist, mesh, [&](const std::string& name, const at::Tensor&) {
    Placements p;
    for (const auto& a : layout.axes) p.push_back(a == "tp" ? train::gpt_tp_placement(name) : Replicate());
    return p;
  });
  Placements data;
  for (const auto& a : layout.axes) data.push_back(a == "dp" ? Placement(Shard(0)) : Placement(Replicate()));

  // AdamW's first step moves every weight by lr * g / (|g| + eps): with the usual eps = 1e-8 a gradient at
  // round-off level (k's bias has gradient exactly 0 in exact arithmetic) takes a full +-lr step whose sign
  // is round-off. eps = 1e-3 keeps the comparison well-conditioned while running every op of the step.
  auto adamw = torch::optim::AdamWOptions(1e-3).weight_decay(0.1).eps(1e-3);
  torch::optim::AdamW opt_ref(ref->parameters(), adamw);
  torch::optim::AdamW opt_dist(dist->parameters(), adamw);
  int64_t gathers = detail::gather_count();
  comm::CommLog::instance().clear();
  at::Tensor loss_ref = ref->loss(idx, targets);
  at::Tensor loss_dist =
      dist->loss(distribute_tensor(idx, mesh, data), distribute_tensor(targets, mesh, data));
  loss_ref.backward();
  loss_dist.backward();
  opt_ref.step();
  opt_dist.step();
  int64_t fell_back = detail::gather_count() - gathers;
  std::string summary = comm::CommLog::instance().summary();
  std::string what = str_cat("GPT ", layout.name, " on ", mesh->to_string(), " batch ", batch);
  check_close(what + " loss", full_tensor(loss_dist.detach()), loss_ref.detach(), 1e-5);
  auto pr = ref->named_parameters(), pd = dist->named_parameters();
  for (const auto& p : pr) {
    const at::Tensor& d = pd[p.key()];
    check_close(str_cat(what, " grad ", p.key()), full_tensor(d.grad()), p.value().grad(), 2e-6);
    // autograd stores each gradient in its parameter's layout, as on plain tensors (the optimizer's
    // elementwise ops are slow on a transposed gradient)
    ++g_checks;
    if (!to_local(d.grad()).is_contiguous()) {
      g_failures += str_cat("FAIL ", what, " grad ", p.key(), ": the block is not contiguous\n");
    }
    check_close(str_cat(what, " after AdamW ", p.key()), full_tensor(d.detach()), p.value().detach(), 2e-6);
  }
  ++g_checks;
  if (fell_back != 0) g_failures += str_cat("FAIL ", what, ": ", fell_back, " ops gathered (no rule)\n");
  if (world->group_rank() == 0) {
    std::fprintf(stderr, "%s: loss %.6f, %ld ops gathered; communication of the step:\n%s", what.c_str(),
                 loss_ref.item<double>(), static_cast<long>(fell_back), summary.c_str());
  }
}

}  // namespace

void suite_gpt(const comm::BackendPtr& world) {
  const int ws = world->group_size();
  models::GPTConfig cfg;
  cfg.vocab_size = 67;
  cfg.block_size = 8;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.n_embd = 32;
  check_layout(world, {"data parallel", {ws}, {"dp"}}, cfg, 2 * ws);
  check_layout(world, {"data parallel (uneven batch)", {ws}, {"dp"}}, cfg, 2 * ws + 1);
  check_layout(world, {"tensor parallel (Megatron)", {ws}, {"tp"}}, cfg, 3);
  if (ws == 4) check_layout(world, {"2-d (dp x tp)", {2, 2}, {"dp", "tp"}}, cfg, 4);
  world->barrier()->wait();
}

}  // namespace dtrain::test
