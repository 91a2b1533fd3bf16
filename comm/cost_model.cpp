// CostModel; see cost_model.h.
#include "comm/cost_model.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"

namespace dtrain::comm {

const char* to_string(StepKind k) {
  switch (k) {
    case StepKind::kAllGather:
      return "all_gather";
    case StepKind::kAllReduce:
      return "all_reduce";
    case StepKind::kReduceScatter:
      return "reduce_scatter";
    case StepKind::kAllToAll:
      return "all_to_all";
    case StepKind::kLocalSlice:
      return "local slice";
    case StepKind::kLocalPartial:
      return "local partial";
    case StepKind::kLocalScale:
      return "local scale";
  }
  return "?";
}

bool is_collective(StepKind k) {
  return k == StepKind::kAllGather || k == StepKind::kAllReduce || k == StepKind::kReduceScatter ||
         k == StepKind::kAllToAll;
}

CostModel CostModel::defaults(int axes) {
  CostModel m;
  m.per_axis_.resize(axes);
  for (auto& kinds : m.per_axis_) {
    for (int k = 0; k < kKinds; ++k) {
      kinds[k] =
          is_collective(static_cast<StepKind>(k)) ? AlphaBeta{200e-6, 1.0 / 1.0e9} : AlphaBeta{0, 1.0 / 10e9};
    }
  }
  return m;
}

CostModel CostModel::from_profile(const CommProfile& profile, int axes) {
  CostModel m = defaults(axes);
  const StepKind kinds[] = {StepKind::kAllGather, StepKind::kAllReduce, StepKind::kReduceScatter,
                            StepKind::kAllToAll};
  for (StepKind k : kinds) {
    auto it = profile.collectives.find(to_string(k));
    if (it == profile.collectives.end())
      continue;  // keep the default for a collective the profile did not measure
    for (int a = 0; a < axes; ++a) m.set(k, a, it->second);
  }
  return m;
}

AlphaBeta fit_alpha_beta(const std::vector<std::pair<double, double>>& pts) {
  // weighted by 1 / seconds^2: each point's relative error counts alike, so that the large sizes (and their
  // noise) do not set the small sizes' latency
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0, n = 0, plain = 0;
  for (auto [x, y] : pts) {
    const double w = y > 0 ? 1.0 / (y * y) : 1.0;
    sw += w;
    sx += w * x;
    sy += w * y;
    sxx += w * x * x;
    sxy += w * x * y;
    n += 1;
    plain += y;
  }
  const double denom = sw * sxx - sx * sx;
  if (pts.size() < 2 || !(denom > 0)) {
    throw ValueError(
        str_cat("fit_alpha_beta: ", pts.size(),
                " points with fewer than two distinct sizes cannot give alpha and beta. Measure at least "
                "two sizes."));
  }
  double beta = (sw * sxy - sx * sy) / denom;
  double alpha = (sy - beta * sx) / sw;
  if (beta < 0) {  // time does not grow with size: all latency, the plain mean
    beta = 0;
    alpha = plain / n;
  }
  if (alpha < 0) {  // refit through the origin
    alpha = 0;
    beta = sxy / sxx;
  }
  return {alpha, beta};
}

void write_profile(const std::string& path, const CommProfile& profile) {
  nlohmann::json j;
  j["format"] = "dtrain-comm-profile";
  j["version"] = 1;
  j["backend"] = profile.backend;
  j["ranks"] = profile.ranks;
  for (const auto& [name, ab] : profile.collectives) {
    j["collectives"][name] = {{"alpha_s", ab.alpha}, {"beta_s_per_byte", ab.beta}};
  }
  write_text_atomic("profile", path, j.dump(2) + "\n");
}

namespace {
CommProfile parse_profile(const std::string& path, const std::string& text);
}  // namespace

CommProfile read_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw ValueError(str_cat("profile: cannot open ", path,
                             ". Measure one with `dtrain run -n N -- dtrain bench comm --profile ", path,
                             "`."));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return parse_profile(path, ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(str_cat("profile: ", path, " has a value of the wrong type (", e.what(),
                             "). Measure it again with dtrain bench comm --profile."));
  }
}

namespace {

CommProfile parse_profile(const std::string& path, const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw ValueError(
        str_cat("profile: ", path, " is not JSON. Measure it again with dtrain bench comm --profile."));
  }
  if (j.value("format", "") != "dtrain-comm-profile" || j.value("version", 0) != 1) {
    throw ValueError(str_cat("profile: ", path, " has format '", j.value("format", ""), "' version ",
                             j.value("version", 0),
                             "; expected 'dtrain-comm-profile' version 1. Measure it again."));
  }
  CommProfile p;
  p.backend = j.value("backend", "");
  p.ranks = j.value("ranks", 0);
  if (!j.contains("collectives") || !j["collectives"].is_object()) {
    throw ValueError(str_cat("profile: ", path, " has no \"collectives\" object. Measure it again."));
  }
  for (auto& [name, v] : j["collectives"].items()) {
    if (!v.is_object() || !v.contains("alpha_s") || !v.contains("beta_s_per_byte") ||
        !v["alpha_s"].is_number() || !v["beta_s_per_byte"].is_number()) {
      throw ValueError(str_cat("profile: ", path, ": collectives.", name,
                               " needs numbers alpha_s and beta_s_per_byte. Measure it again."));
    }
    AlphaBeta ab{v["alpha_s"].get<double>(), v["beta_s_per_byte"].get<double>()};
    if (!(ab.alpha >= 0) || !(ab.beta >= 0) || !std::isfinite(ab.alpha) || !std::isfinite(ab.beta)) {
      throw ValueError(str_cat("profile: ", path, ": collectives.", name, " has alpha_s=", ab.alpha,
                               " beta_s_per_byte=", ab.beta, "; both must be finite and >= 0."));
    }
    p.collectives[name] = ab;
  }
  return p;
}

}  // namespace

double CostModel::seconds(StepKind kind, int axis, double bytes) const {
  const AlphaBeta& ab = get(kind, axis);
  return ab.alpha + ab.beta * bytes;
}

void CostModel::set(StepKind kind, int axis, AlphaBeta ab) {
  DTRAIN_ASSERT(axis >= 0 && axis < axes(), "axis ", axis, " of ", axes());
  per_axis_[axis][static_cast<int>(kind)] = ab;
}

const AlphaBeta& CostModel::get(StepKind kind, int axis) const {
  DTRAIN_ASSERT(axis >= 0 && axis < axes(), "axis ", axis, " of ", axes());
  return per_axis_[axis][static_cast<int>(kind)];
}

}  // namespace dtrain::comm
