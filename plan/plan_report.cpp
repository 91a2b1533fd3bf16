// The plan's report; see plan_report.h.
#include "plan/plan_report.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "parallel/strategy.h"

namespace dtrain::plan {

std::string plan_table(const Plan& plan) {
  std::string out;
  for (const auto& n : plan.notes) out += str_cat("# ", n, "\n");
  char line[512];
  std::snprintf(line, sizeof(line), "%4s  %-42s %10s %10s %5s  %s\n", "rank", "candidate", "step(ms)",
                "peak(MiB)", "fits", "reason");
  out += line;
  for (const auto& c : plan.candidates) {
    std::snprintf(line, sizeof(line), "%4s  %-42s %10.2f %10.1f %5s  %s%s\n",
                  c.rank > 0 ? str_cat(c.rank).c_str() : "-", c.name().c_str(), c.predicted_step_s * 1e3,
                  c.predicted_peak_bytes / (1 << 20), c.fits ? "yes" : "no", c.chosen ? "CHOSEN: " : "",
                  c.reason.c_str());
    out += line;
  }
  return out;
}

std::string candidate_json(const Candidate& c) {
  nlohmann::json mem = nlohmann::json::object(), comm = nlohmann::json::object();
  for (const auto& [k, v] : c.memory) mem[k] = v / (1 << 20);
  for (const auto& [k, v] : c.comm) comm[k] = v;
  nlohmann::json j{{"name", c.name()},
                   {"strategy", c.strategy},
                   {"tp", c.tp},
                   {"sequence_parallel", c.sequence_parallel},
                   {"checkpoint_activations", c.checkpoint_activations},
                   {"micro_batch", c.micro_batch},
                   {"accumulation", c.accumulation},
                   {"bucket_bytes", c.bucket_bytes},
                   {"shard_size", c.shard_size},
                   {"mesh_order", c.mesh_order},
                   {"predicted_step_s", c.predicted_step_s},
                   {"predicted_peak_mib", c.predicted_peak_bytes / (1 << 20)},
                   {"fits", c.fits},
                   {"chosen", c.chosen},
                   {"rank", c.rank},
                   {"reason", c.reason},
                   {"flags", c.flags},
                   {"compute_s", c.compute_s},
                   {"optimizer_s", c.optimizer_s},
                   {"comm_s", c.comm_s},
                   {"exposed_comm_s", c.exposed_comm_s},
                   {"strategy_overhead_s", c.strategy_overhead_s},
                   {"in_step_s", c.in_step_s},
                   {"comm_calls", c.comm_calls},
                   {"comm_s_by_cause", comm},
                   {"memory_mib", mem}};
  return j.dump();
}

Candidate candidate_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  Candidate c;
  try {
    if (j.is_discarded() || !j.is_object()) throw ValueError("not a JSON object");
    c.strategy = j.at("strategy").get<std::string>();
    c.tp = j.at("tp").get<int64_t>();
    c.sequence_parallel = j.at("sequence_parallel").get<bool>();
    c.checkpoint_activations = j.at("checkpoint_activations").get<bool>();
    c.micro_batch = j.at("micro_batch").get<int64_t>();
    c.accumulation = j.at("accumulation").get<int64_t>();
    c.bucket_bytes = j.at("bucket_bytes").get<int64_t>();
    c.shard_size = j.at("shard_size").get<int64_t>();
    c.mesh_order = j.at("mesh_order").get<std::string>();
    c.predicted_step_s = j.at("predicted_step_s").get<double>();
    c.predicted_peak_bytes = j.at("predicted_peak_mib").get<double>() * (1 << 20);
    c.fits = j.at("fits").get<bool>();
    c.chosen = j.at("chosen").get<bool>();
    c.rank = j.at("rank").get<int>();
    c.reason = j.at("reason").get<std::string>();
    c.flags = j.at("flags").get<std::vector<std::string>>();
    c.compute_s = j.at("compute_s").get<double>();
    c.optimizer_s = j.at("optimizer_s").get<double>();
    c.comm_s = j.at("comm_s").get<double>();
    c.exposed_comm_s = j.at("exposed_comm_s").get<double>();
    c.strategy_overhead_s = j.at("strategy_overhead_s").get<double>();
    c.in_step_s = j.value("in_step_s", 0.0);
    c.comm_calls = j.value("comm_calls", int64_t{0});
    for (const auto& [k, v] : j.at("comm_s_by_cause").items()) c.comm[k] = v.get<double>();
    for (const auto& [k, v] : j.at("memory_mib").items()) c.memory[k] = v.get<double>() * (1 << 20);
  } catch (const std::exception& e) {
    throw ValueError(
        str_cat("plan: a candidate's JSON cannot be read (", e.what(), "): ", text.substr(0, 200)));
  }
  return c;
}

std::string placements(const Candidate& c, const ModelFacts& f, int64_t world) {
  const int64_t n = world / c.tp;
  std::string mesh;
  std::string dp_axis;
  if (c.strategy == "hsdp") {
    mesh = parallel::groups_strided(c.mesh_order)
               ? str_cat("shard=", c.shard_size, ", replicate=", n / c.shard_size)
               : str_cat("replicate=", n / c.shard_size, ", shard=", c.shard_size);
    dp_axis = "replicate: Replicate()  shard: Shard(0)";
  } else {
    mesh = str_cat("dp=", n);
    dp_axis = c.strategy == "zero3" ? "dp: Shard(0)" : "dp: Replicate()";
  }
  if (c.tp > 1)
    mesh = parallel::groups_strided(c.mesh_order) ? str_cat("tp=", c.tp, ", ", mesh)
                                                  : str_cat(mesh, ", tp=", c.tp);
  std::string out =
      str_cat("mesh [", mesh, "]; each parameter's placement per axis",
              c.strategy == "zero3" || c.strategy == "hsdp" ? " (Shard(0): flattened, as FSDP)" : "",
              c.strategy == "zero1" || c.strategy == "zero2"
                  ? " (parameters whole; optimizer state" +
                        std::string(c.strategy == "zero2" ? " and gradients" : "") + " sharded over dp)"
                  : "",
              ":\n");
  for (const auto& p : f.params) {
    out += str_cat("  ", p.name, "  ", dp_axis, c.tp > 1 ? str_cat("  tp: ", p.tp_placement) : "", "\n");
  }
  return out;
}

}  // namespace dtrain::plan
