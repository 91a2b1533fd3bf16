// ModelFacts; see model_facts.h.
#include "plan/model_facts.h"

#include "core/error.h"

namespace dtrain::plan {

int64_t ModelFacts::total_params() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel;
  return n;
}

int64_t ModelFacts::params_per_rank(int64_t tp) const {
  int64_t n = 0;
  for (const auto& p : params) n += p.tp_placement == "Replicate()" ? p.numel : (p.numel + tp - 1) / tp;
  return n;
}

ModelFacts model_facts(torch::nn::Module& module, const parallel::TensorParallelPlan& plan,
                       std::vector<int64_t> tp_degrees, bool can_checkpoint, int64_t data_bytes,
                       std::string description) {
  ModelFacts f;
  f.description = std::move(description);
  f.tp_degrees = std::move(tp_degrees);
  f.can_checkpoint = can_checkpoint;
  f.data_bytes = data_bytes;
  for (const auto& item : module.named_parameters()) {
    ParamFact p;
    p.name = item.key();
    p.numel = item.value().numel();
    f.element_bytes = item.value().element_size();
    const auto dot = p.name.rfind('.');
    const std::string owner = dot == std::string::npos ? "" : p.name.substr(0, dot);
    const std::string leaf = p.name.substr(dot == std::string::npos ? 0 : dot + 1);
    for (const auto& [pattern, style] : plan.styles) {
      if (!parallel::tp_pattern_matches(pattern, owner)) continue;
      using Kind = parallel::TPStyle::Kind;
      if (style.kind == Kind::kColwise || style.kind == Kind::kVocab) p.tp_placement = "Shard(0)";
      if (style.kind == Kind::kRowwise && leaf == "weight") p.tp_placement = "Shard(1)";
      break;
    }
    f.params.push_back(p);
  }
  return f;
}

}  // namespace dtrain::plan
