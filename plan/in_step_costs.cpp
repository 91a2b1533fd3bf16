// InStepCosts; see in_step_costs.h.
#include "plan/in_step_costs.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"

namespace dtrain::plan {

namespace {

// The unit size of `family`'s points nearest `unit_bytes` by ratio (exact for 0); nullopt: no point.
std::optional<int64_t> nearest_unit(const std::vector<InStepPoint>& points, const std::string& family,
                                    int64_t unit_bytes) {
  double best = -1;
  int64_t unit = 0;
  for (const auto& p : points) {
    if (p.family != family) continue;
    const double d =
        p.unit_bytes > 0 && unit_bytes > 0
            ? std::abs(std::log(static_cast<double>(p.unit_bytes) / static_cast<double>(unit_bytes)))
            : (p.unit_bytes == unit_bytes ? 0.0 : 1.0);
    if (best < 0 || d < best) {
      best = d;
      unit = p.unit_bytes;
    }
  }
  if (best < 0) return std::nullopt;
  return unit;
}

}  // namespace

std::optional<double> InStepCosts::per_call(const std::string& family, int64_t unit_bytes,
                                            double micro_batch) const {
  const auto unit = nearest_unit(points, family, unit_bytes);
  if (!unit) return std::nullopt;
  std::vector<const InStepPoint*> ps;
  for (const auto& p : points) {
    if (p.family == family && p.unit_bytes == *unit && p.accumulation == 1) ps.push_back(&p);
  }
  if (ps.empty()) return std::nullopt;
  std::sort(ps.begin(), ps.end(), [](auto* a, auto* b) { return a->micro_batch < b->micro_batch; });
  if (ps.size() == 1) return ps[0]->per_call_s;
  // beyond the measured sizes, the nearest end's figure (a line through two noisy points would amplify
  // their noise); between them, the segment holding micro_batch
  if (micro_batch <= static_cast<double>(ps.front()->micro_batch)) return ps.front()->per_call_s;
  if (micro_batch >= static_cast<double>(ps.back()->micro_batch)) return ps.back()->per_call_s;
  size_t i = 0;
  while (i + 2 < ps.size() && static_cast<double>(ps[i + 1]->micro_batch) < micro_batch) ++i;
  const double x0 = static_cast<double>(ps[i]->micro_batch), x1 = static_cast<double>(ps[i + 1]->micro_batch);
  const double y0 = ps[i]->per_call_s, y1 = ps[i + 1]->per_call_s;
  if (x1 == x0) return (y0 + y1) / 2;
  return y0 + (y1 - y0) * (micro_batch - x0) / (x1 - x0);
}

std::optional<double> InStepCosts::per_micro_batch(const std::string& family, int64_t unit_bytes) const {
  const auto unit = nearest_unit(points, family, unit_bytes);
  if (!unit) return std::nullopt;
  for (const auto& two : points) {
    if (two.family != family || two.unit_bytes != *unit || two.accumulation != 2) continue;
    for (const auto& one : points) {
      if (one.family == family && one.unit_bytes == *unit && one.accumulation == 1 &&
          one.micro_batch == two.micro_batch) {
        return two.per_call_s * static_cast<double>(two.calls) -
               one.per_call_s * static_cast<double>(one.calls);
      }
    }
  }
  return std::nullopt;
}

void write_in_step_costs(const std::string& path, const InStepCosts& c) {
  nlohmann::json pts = nlohmann::json::array();
  for (const auto& p : c.points) {
    pts.push_back({{"family", p.family},
                   {"unit_bytes", p.unit_bytes},
                   {"micro_batch", p.micro_batch},
                   {"accumulation", p.accumulation},
                   {"calls", p.calls},
                   {"per_call_s", p.per_call_s}});
  }
  const nlohmann::json j{{"format", "dtrain-in-step-costs"},
                         {"version", 1},
                         {"key", c.key},
                         {"measured_s", c.measured_s},
                         {"points", pts}};
  write_text_atomic("in-step costs", path, j.dump(2) + "\n");
}

InStepCosts read_in_step_costs(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw ValueError(str_cat("in-step costs ", path, " cannot be opened. Delete it to measure again."));
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "dtrain-in-step-costs") {
    throw ValueError(
        str_cat("in-step costs ", path,
                " is not a dtrain in-step costs file (format \"dtrain-in-step-costs\"). Delete it "
                "to measure again."));
  }
  InStepCosts c;
  try {
    c.key = j.at("key").get<std::string>();
    c.measured_s = j.value("measured_s", 0.0);
    for (const auto& p : j.at("points")) {
      InStepPoint q;
      q.family = p.at("family").get<std::string>();
      q.unit_bytes = p.at("unit_bytes").get<int64_t>();
      q.micro_batch = p.at("micro_batch").get<int64_t>();
      q.accumulation = p.value("accumulation", int64_t{1});
      q.calls = p.at("calls").get<int64_t>();
      q.per_call_s = p.at("per_call_s").get<double>();
      if (q.micro_batch < 1 || q.accumulation < 1 || q.calls < 1 || !std::isfinite(q.per_call_s)) {
        throw ValueError(str_cat("micro_batch ", q.micro_batch, ", accumulation ", q.accumulation, ", calls ",
                                 q.calls, ", per_call_s ", q.per_call_s,
                                 ": counts must be >= 1, seconds finite"));
      }
      c.points.push_back(q);
    }
  } catch (const std::exception& e) {
    throw ValueError(
        str_cat("in-step costs ", path, " has a bad value (", e.what(), "). Delete it to measure again."));
  }
  return c;
}

}  // namespace dtrain::plan
