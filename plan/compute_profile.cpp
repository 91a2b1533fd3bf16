// ComputeProfile; see compute_profile.h.
#include "plan/compute_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"

namespace dtrain::plan {

namespace {

// Through the points of one setting: between two measured sizes the line joining them; beyond them the line
// through the two nearest (never below zero); one point: a line through the origin.
template <typename Get>
double fit_at(const std::vector<ComputePoint>& pts, const ComputeSetting& s, double x, Get field,
              const char* what) {
  std::vector<std::pair<double, double>> xy;
  for (const auto& p : pts) {
    if (p.setting == s) xy.emplace_back(static_cast<double>(p.micro_batch), field(p));
  }
  if (xy.empty()) {
    throw ValueError(str_cat("compute profile: no measurement under ", s.to_string(), " to predict the ",
                             what, " from. Measure the profile again (delete the cached file)."));
  }
  std::sort(xy.begin(), xy.end());
  if (xy.size() == 1) return xy[0].second * x / xy[0].first;
  size_t hi = 1;
  while (hi + 1 < xy.size() && xy[hi].first < x) ++hi;
  const auto [x0, y0] = xy[hi - 1];
  const auto [x1, y1] = xy[hi];
  if (x1 == x0) return y1;
  return std::max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0));
}

nlohmann::json comm_json(const std::vector<MeasuredComm>& comm) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& c : comm) a.push_back({{"op", c.op}, {"count", c.count}, {"bytes", c.bytes}});
  return a;
}

}  // namespace

double ComputeProfile::forward_seconds(double mb, const ComputeSetting& s) const {
  return fit_at(
      points, s, mb, [](const ComputePoint& p) { return p.forward_s; }, "forward time");
}
double ComputeProfile::backward_seconds(double mb, const ComputeSetting& s) const {
  return fit_at(
      points, s, mb, [](const ComputePoint& p) { return p.backward_s; }, "backward time");
}
double ComputeProfile::activation_bytes(double mb, const ComputeSetting& s) const {
  return fit_at(
      points, s, mb, [](const ComputePoint& p) { return static_cast<double>(p.activation_bytes); },
      "activation memory");
}
bool ComputeProfile::has(const ComputeSetting& s) const {
  for (const auto& p : points) {
    if (p.setting == s) return true;
  }
  return false;
}

std::vector<MeasuredComm> ComputeProfile::collectives(double mb, const ComputeSetting& s) const {
  const ComputePoint* best = nullptr;
  for (const auto& p : points) {
    if (p.setting == s && (!best || std::abs(static_cast<double>(p.micro_batch) - mb) <
                                        std::abs(static_cast<double>(best->micro_batch) - mb))) {
      best = &p;
    }
  }
  if (!best) {
    throw ValueError(str_cat("compute profile: no measurement under ", s.to_string(),
                             " to count its collectives from. Measure the profile again."));
  }
  std::vector<MeasuredComm> out = best->comm;
  for (auto& c : out) {
    c.bytes =
        static_cast<int64_t>(static_cast<double>(c.bytes) * mb / static_cast<double>(best->micro_batch));
  }
  return out;
}

const StrategyPoint* ComputeProfile::rehearsal(const std::string& strategy, int64_t bucket_bytes,
                                               bool checkpoint, int64_t accumulation) const {
  const std::string name = strategy == "hsdp" ? "zero3" : strategy;
  for (const auto& r : strategies) {
    if (r.strategy == name && r.bucket_bytes == bucket_bytes && r.checkpoint == checkpoint &&
        (r.accumulation == 1) == (accumulation == 1)) {
      return &r;
    }
  }
  return nullptr;
}

std::string ComputeSetting::to_string() const {
  return str_cat("tp ", tp, sequence_parallel ? ", sequence parallel" : "",
                 checkpoint ? ", checkpointing" : ", no checkpointing");
}

void write_compute_profile(const std::string& path, const ComputeProfile& p) {
  nlohmann::json j{{"format", "dtrain-compute-profile"},
                   {"version", 1},
                   {"signature", p.signature},
                   {"model", p.model},
                   {"threads", p.threads},
                   {"dtype", p.dtype},
                   {"params", p.params},
                   {"optimizer_s_per_param", p.optimizer_s_per_param},
                   {"measured_s", p.measured_s},
                   {"unsteady", p.unsteady}};
  j["points"] = nlohmann::json::array();
  for (const auto& q : p.points) {
    j["points"].push_back({{"micro_batch", q.micro_batch},
                           {"tp", q.setting.tp},
                           {"sequence_parallel", q.setting.sequence_parallel},
                           {"checkpoint", q.setting.checkpoint},
                           {"forward_s", q.forward_s},
                           {"backward_s", q.backward_s},
                           {"activation_bytes", q.activation_bytes},
                           {"comm", comm_json(q.comm)}});
  }
  j["strategies"] = nlohmann::json::array();
  for (const auto& r : p.strategies) {
    j["strategies"].push_back({{"strategy", r.strategy},
                               {"group", r.group},
                               {"bucket_bytes", r.bucket_bytes},
                               {"checkpoint", r.checkpoint},
                               {"accumulation", r.accumulation},
                               {"micro_batch", r.micro_batch},
                               {"step_s", r.step_s},
                               {"peak_bytes", r.peak_bytes},
                               {"step_peak_bytes", r.step_peak_bytes}});
  }
  write_text_atomic("compute profile", path, j.dump(2) + "\n");
}

ComputeProfile read_compute_profile(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    throw ValueError(str_cat("compute profile ", path,
                             " cannot be read. Give an existing file, or let dtrain measure one."));
  }
  std::stringstream text;
  text << f.rdbuf();
  ComputeProfile p;
  try {
    const nlohmann::json j = nlohmann::json::parse(text.str());
    if (j.value("format", "") != "dtrain-compute-profile") {
      throw ValueError(str_cat("compute profile ", path, " is not one (its \"format\" is not ",
                               "\"dtrain-compute-profile\"). Give a file dtrain wrote, or delete it."));
    }
    p.signature = j.at("signature").get<std::string>();
    p.model = j.value("model", "");
    p.threads = j.at("threads").get<int>();
    p.dtype = j.at("dtype").get<std::string>();
    p.params = j.at("params").get<int64_t>();
    p.optimizer_s_per_param = j.at("optimizer_s_per_param").get<double>();
    p.measured_s = j.value("measured_s", 0.0);
    p.unsteady = j.value("unsteady", 1.0);
    for (const auto& q : j.at("points")) {
      ComputePoint c;
      c.micro_batch = q.at("micro_batch").get<int64_t>();
      c.setting.tp = q.at("tp").get<int64_t>();
      c.setting.sequence_parallel = q.at("sequence_parallel").get<bool>();
      c.setting.checkpoint = q.at("checkpoint").get<bool>();
      c.forward_s = q.at("forward_s").get<double>();
      c.backward_s = q.at("backward_s").get<double>();
      c.activation_bytes = q.at("activation_bytes").get<int64_t>();
      if (c.micro_batch < 1 || c.setting.tp < 1 || c.forward_s < 0 || c.backward_s < 0 ||
          c.activation_bytes < 0) {
        throw ValueError(str_cat("compute profile ", path, ": a point has micro_batch ", c.micro_batch,
                                 ", forward_s ", c.forward_s, ", backward_s ", c.backward_s,
                                 ", activation_bytes ", c.activation_bytes,
                                 "; all must be positive. Delete the file to measure again."));
      }
      if (q.contains("comm")) {
        for (const auto& m : q.at("comm")) {
          c.comm.push_back(
              {m.at("op").get<std::string>(), m.at("count").get<int64_t>(), m.at("bytes").get<int64_t>()});
        }
      }
      p.points.push_back(c);
    }
    for (const auto& r : j.value("strategies", nlohmann::json::array())) {
      p.strategies.push_back({r.at("strategy").get<std::string>(), r.at("group").get<int64_t>(),
                              r.at("bucket_bytes").get<int64_t>(), r.at("checkpoint").get<bool>(),
                              r.at("accumulation").get<int64_t>(), r.at("micro_batch").get<int64_t>(),
                              r.at("step_s").get<double>(), r.at("peak_bytes").get<int64_t>(),
                              r.at("step_peak_bytes").get<int64_t>()});
    }
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(
        str_cat("compute profile ", path, " is malformed (", e.what(), "). Delete it to measure again."));
  }
  if (p.points.empty() || p.optimizer_s_per_param <= 0) {
    throw ValueError(str_cat("compute profile ", path,
                             " has no measurement (no points, or no optimizer rate). Delete it to measure "
                             "again."));
  }
  return p;
}

}  // namespace dtrain::plan
