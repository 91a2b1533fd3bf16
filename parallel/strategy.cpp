// The strategies' names; see strategy.h.
#include "parallel/strategy.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace dtrain::parallel {

namespace {

struct Name {
  const char* name;
  Strategy strategy;
};

// Canonical names first; the table in docs/architecture.md lists the same.
constexpr Name kNames[] = {
    {"dp", Strategy::kDataParallel},      {"zero1", Strategy::kZero1},
    {"zero2", Strategy::kZero2},          {"zero3", Strategy::kZero3},
    {"hsdp", Strategy::kHybridShard},     {"ddp", Strategy::kDataParallel},
    {"horovod", Strategy::kDataParallel}, {"deepspeed1", Strategy::kZero1},
    {"deepspeed2", Strategy::kZero2},     {"deepspeed3", Strategy::kZero3},
    {"shard_grad_op", Strategy::kZero2},  {"full_shard", Strategy::kZero3},
    {"fsdp", Strategy::kZero3},           {"hybrid_shard", Strategy::kHybridShard},
};
constexpr int kCanonical = 5;

}  // namespace

const char* to_string(Strategy s) {
  for (int i = 0; i < kCanonical; ++i) {
    if (kNames[i].strategy == s) return kNames[i].name;
  }
  return "?";
}

std::vector<std::string> strategy_names() {
  std::vector<std::string> out;
  for (int i = 0; i < kCanonical; ++i) out.emplace_back(kNames[i].name);
  return out;
}

Strategy parse_strategy(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& n : kNames) {
    if (s == n.name) return n.strategy;
  }
  if (s == "deepspeed") {
    throw ValueError(
        "strategy: 'deepspeed' needs a stage, as DeepSpeed's zero_optimization.stage does. Use zero1, zero2 "
        "or "
        "zero3 (or deepspeed1..3).");
  }
  throw ValueError(
      str_cat("strategy: '", name,
              "' is not a strategy. Use dp (Horovod-style data parallel; also ddp, horovod), zero1, "
              "zero2, zero3 (DeepSpeed ZeRO stages; also fsdp = zero3) or hsdp."));
}

std::vector<std::string> parse_mesh_order(const std::string& text) {
  std::vector<std::string> out;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find(',', at), text.size());
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

bool groups_strided(const std::string& text) {
  const std::vector<std::string> axes = parse_mesh_order(text);
  return !axes.empty() && (axes.front() == "tp" || axes.front() == "shard");
}

}  // namespace dtrain::parallel
