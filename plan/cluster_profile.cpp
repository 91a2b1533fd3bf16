// ClusterProfile; see cluster_profile.h.
#include "plan/cluster_profile.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "plan/comm_benchmark.h"

namespace dtrain::plan {

namespace {

const char* kMeasure = "Measure it with `dtrain run -n N -- dtrain bench comm --profile FILE`";

LinkProfile parse_link(const std::string& path, const std::string& where, const nlohmann::json& j) {
  LinkProfile l;
  if (!j.contains("collectives") || !j["collectives"].is_object()) {
    throw ValueError(
        str_cat("profile ", path, ": ", where, " has no \"collectives\" object. ", kMeasure, "."));
  }
  if (!j.contains("ranks") || !j["ranks"].is_number_integer() || j["ranks"].get<int>() < 2) {
    throw ValueError(str_cat("profile ", path, ": ", where,
                             " needs \"ranks\", the group size it was measured at (2 or more). ", kMeasure,
                             "."));
  }
  l.ranks = j["ranks"].get<int>();
  for (const auto& [name, v] : j["collectives"].items()) {
    if (!v.is_object() || !v.contains("alpha_s") || !v.contains("beta_s_per_byte") ||
        !v["alpha_s"].is_number() || !v["beta_s_per_byte"].is_number()) {
      throw ValueError(str_cat("profile ", path, ": ", where, ".collectives.", name,
                               " needs numbers alpha_s and beta_s_per_byte. ", kMeasure, "."));
    }
    const comm::AlphaBeta ab{v["alpha_s"].get<double>(), v["beta_s_per_byte"].get<double>()};
    if (!(ab.alpha >= 0) || !(ab.beta >= 0) || !std::isfinite(ab.alpha) || !std::isfinite(ab.beta)) {
      throw ValueError(str_cat("profile ", path, ": ", where, ".collectives.", name, " has alpha_s=",
                               ab.alpha, " beta_s_per_byte=", ab.beta, "; both must be finite and >= 0."));
    }
    l.collectives[name] = ab;
  }
  return l;
}

nlohmann::json link_json(const LinkProfile& l) {
  nlohmann::json c = nlohmann::json::object();
  for (const auto& [name, ab] : l.collectives)
    c[name] = {{"alpha_s", ab.alpha}, {"beta_s_per_byte", ab.beta}};
  return {{"ranks", l.ranks}, {"collectives", c}};
}

}  // namespace

double ClusterProfile::seconds(const std::string& op, int64_t n, double bytes, bool across_hosts) const {
  if (n <= 1) return 0;
  const LinkProfile& l = across_hosts ? inter_host : intra_host;
  const std::string from = built_in ? "the built-in profile" : str_cat("profile ", path);
  if (!l.measured()) {
    throw ValueError(
        str_cat(from, " has no ", across_hosts ? "inter_host" : "intra-host",
                " links, and this plan needs them (a group ", across_hosts ? "across" : "inside", " hosts). ",
                kMeasure, across_hosts ? " with ranks on two or more hosts (it adds \"inter_host\")." : "."));
  }
  auto it = l.collectives.find(op);
  if (it == l.collectives.end()) {
    throw ValueError(str_cat(from, " has no figures for ", op, ". ", kMeasure, " --ops ", op, "."));
  }
  const double alpha =
      it->second.alpha * static_cast<double>(n - 1) / static_cast<double>(std::max(1, l.ranks - 1));
  return alpha + it->second.beta * bytes * bus_factor(op, static_cast<int>(n));
}

ClusterProfile read_cluster_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ValueError(str_cat("profile ", path, " cannot be opened. ", kMeasure, "."));
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw ValueError(str_cat("profile ", path, " is not JSON. ", kMeasure, "."));
  }
  if (j.value("format", "") != "dtrain-comm-profile") {
    throw ValueError(str_cat("profile ", path, " is not a dtrain profile (its \"format\" is not ",
                             "\"dtrain-comm-profile\"). ", kMeasure, "."));
  }
  ClusterProfile p;
  p.path = path;
  try {
    p.backend = j.value("backend", "");
    p.source = j.value("source", "measured by dtrain bench comm");
    if (j.contains("collectives")) p.intra_host = parse_link(path, "the profile", j);
    if (j.contains("inter_host")) p.inter_host = parse_link(path, "inter_host", j["inter_host"]);
    if (j.contains("overlap")) {
      p.overlap = j["overlap"].get<double>();
      if (!(p.overlap >= 0 && p.overlap <= 1)) {
        throw ValueError(str_cat("profile ", path, ": overlap ", p.overlap, " must be between 0 and 1."));
      }
    }
    p.blocking_penalty_s = j.value("blocking_penalty_s", 0.0);
    if (!(p.blocking_penalty_s >= 0)) {
      throw ValueError(
          str_cat("profile ", path, ": blocking_penalty_s ", p.blocking_penalty_s, " must be >= 0."));
    }
    if (j.contains("compute")) {
      const auto& c = j["compute"];
      p.flops_per_s = c.value("flops_per_s", 0.0);
      p.optimizer_s_per_param = c.value("optimizer_s_per_param", 0.0);
      p.memory_bytes = c.value("memory_bytes", 0.0);
      if (!(p.flops_per_s > 0) || !(p.optimizer_s_per_param > 0)) {
        throw ValueError(str_cat("profile ", path, ": compute needs positive flops_per_s and ",
                                 "optimizer_s_per_param (got ", p.flops_per_s, " and ",
                                 p.optimizer_s_per_param, ")."));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(
        str_cat("profile ", path, " has a value of the wrong type (", e.what(), "). ", kMeasure, "."));
  }
  if (!p.intra_host.measured() && !p.inter_host.measured()) {
    throw ValueError(str_cat("profile ", path, " holds no link figures. ", kMeasure, "."));
  }
  return p;
}

void write_cluster_profile(const std::string& path, const ClusterProfile& p) {
  nlohmann::json j{{"format", "dtrain-comm-profile"}, {"version", 1}, {"backend", p.backend}};
  if (!p.source.empty()) j["source"] = p.source;
  if (p.intra_host.measured()) {
    const nlohmann::json l = link_json(p.intra_host);
    j["ranks"] = l["ranks"];
    j["collectives"] = l["collectives"];
  }
  if (p.inter_host.measured()) j["inter_host"] = link_json(p.inter_host);
  if (p.overlap >= 0) j["overlap"] = p.overlap;
  if (p.blocking_penalty_s > 0) j["blocking_penalty_s"] = p.blocking_penalty_s;
  if (p.flops_per_s > 0) {
    j["compute"] = {{"flops_per_s", p.flops_per_s}, {"optimizer_s_per_param", p.optimizer_s_per_param}};
    if (p.memory_bytes > 0) j["compute"]["memory_bytes"] = p.memory_bytes;
  }
  write_text_atomic("profile", path, j.dump(2) + "\n");
}

ClusterProfile built_in_cluster_profile() {
  ClusterProfile p;
  p.built_in = true;
  p.source = "built-in defaults (loopback TCP on one host, DESIGN §8), not measured";
  p.intra_host.ranks = 2;
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"}) {
    p.intra_host.collectives[op] = {200e-6, 1.0 / 1.0e9};
  }
  return p;
}

}  // namespace dtrain::plan
