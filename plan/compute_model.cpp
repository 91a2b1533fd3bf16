// The planner's compute models; see compute_model.h.
#include "plan/compute_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dtrain::plan {

namespace {

class Measured final : public ComputeModel {
 public:
  Measured(ComputeProfile p, std::string file) : p_(std::move(p)), file_(std::move(file)) {}
  double forward_s(double mb, const ComputeSetting& s) const override { return p_.forward_seconds(mb, s); }
  double backward_s(double mb, const ComputeSetting& s) const override { return p_.backward_seconds(mb, s); }
  double activation_bytes(double mb, const ComputeSetting& s) const override {
    return p_.activation_bytes(mb, s);
  }
  std::vector<MeasuredComm> tp_collectives(double mb, const ComputeSetting& s) const override {
    return s.tp > 1 ? p_.collectives(mb, s) : std::vector<MeasuredComm>{};
  }
  double optimizer_s(double params) const override { return p_.optimizer_s_per_param * params; }
  bool has(const ComputeSetting& s) const override { return p_.has(s); }
  const StrategyPoint* rehearsal(const std::string& strategy, int64_t bucket_bytes, bool checkpoint,
                                 int64_t accumulation) const override {
    return p_.rehearsal(strategy, bucket_bytes, checkpoint, accumulation);
  }
  std::string source() const override {
    std::string unsteady;
    if (p_.unsteady > 1.1) {
      unsteady =
          str_cat("; the machine ran up to ", static_cast<int>(std::lround((p_.unsteady - 1) * 100)),
                  "% slower than its fastest while part of it was timed, so its times may be that much "
                  "high: delete the file to measure it again");
    }
    return str_cat("measured on this machine: ", p_.model, ", ", p_.threads, " thread",
                   p_.threads == 1 ? "" : "s", ", ", p_.dtype, " (", file_, ", measured in ", p_.measured_s,
                   " s", unsteady, ")");
  }

 private:
  ComputeProfile p_;
  std::string file_;
};

class Analytic final : public ComputeModel {
 public:
  Analytic(const TransformerShape& t, double rate, double opt) : t_(t), rate_(rate), opt_(opt) {
    if (t.layers < 1 || t.width < 1 || t.heads < 1 || t.seq < 1 || t.vocab < 1 || !(rate > 0) || !(opt > 0)) {
      throw ValueError(str_cat("counted compute: the shape (", t.layers, " layers, width ", t.width, ", ",
                               t.heads, " heads, seq ", t.seq, ", vocab ", t.vocab, ") and the profile's ",
                               "flops_per_s ", rate, " and optimizer_s_per_param ", opt,
                               " must all be positive."));
    }
  }
  double forward_s(double mb, const ComputeSetting& s) const override { return flops(mb, s) / rate_; }
  double backward_s(double mb, const ComputeSetting& s) const override {
    return (2 * flops(mb, s) + (s.checkpoint ? layer_flops(mb, s) * static_cast<double>(t_.layers) : 0)) /
           rate_;
  }
  double activation_bytes(double mb, const ComputeSetting& s) const override {
    const double sbh = static_cast<double>(t_.seq) * mb * static_cast<double>(t_.width);
    const double tp = static_cast<double>(s.tp);
    const double attn = 5.0 * static_cast<double>(t_.heads * t_.seq) / static_cast<double>(t_.width) / tp;
    const double per_layer = sbh * (s.sequence_parallel ? 34.0 / tp + attn : 10.0 + 24.0 / tp + attn);
    const double scale = static_cast<double>(t_.element_bytes) / 2.0;  // the counts are for 16-bit values
    const double layers =
        s.checkpoint
            ? 2.0 * sbh * static_cast<double>(t_.layers) / (s.sequence_parallel ? tp : 1.0) + per_layer
            : per_layer * static_cast<double>(t_.layers);
    const double logits = 2.0 * static_cast<double>(t_.seq) * mb * static_cast<double>(t_.vocab) / tp *
                          static_cast<double>(t_.element_bytes);
    return layers * scale + logits;
  }
  std::vector<MeasuredComm> tp_collectives(double mb, const ComputeSetting& s) const override {
    if (s.tp == 1) return {};
    const int64_t bytes = static_cast<int64_t>(static_cast<double>(t_.seq) * mb *
                                               static_cast<double>(t_.width * t_.element_bytes));
    const int64_t per_layer = s.checkpoint ? 6 : 4;  // (the recomputation repeats the forward's two)
    const int64_t n = per_layer * t_.layers;
    if (!s.sequence_parallel) return {{"all_reduce", n, n * bytes}};
    return {{"all_gather", n, n * bytes}, {"reduce_scatter", n, n * bytes}};
  }
  double optimizer_s(double params) const override { return opt_ * params; }
  bool has(const ComputeSetting&) const override { return true; }
  std::string source() const override {
    return str_cat("counted from the shape (", t_.layers, " layers x ", t_.width, ", ", t_.heads,
                   " heads, seq ", t_.seq, ") at the profile's ", rate_ / 1e12, " Tflop/s");
  }

 private:
  double layer_flops(double mb, const ComputeSetting& s) const {
    const double tokens = mb * static_cast<double>(t_.seq), h = static_cast<double>(t_.width);
    return tokens * (24.0 * h * h + 4.0 * static_cast<double>(t_.seq) * h) / static_cast<double>(s.tp);
  }
  double flops(double mb, const ComputeSetting& s) const {
    const double tokens = mb * static_cast<double>(t_.seq);
    return layer_flops(mb, s) * static_cast<double>(t_.layers) +
           2.0 * tokens * static_cast<double>(t_.width * t_.vocab) / static_cast<double>(s.tp);
  }
  TransformerShape t_;
  double rate_, opt_;
};

}  // namespace

std::unique_ptr<ComputeModel> measured_compute(ComputeProfile profile, std::string file) {
  return std::make_unique<Measured>(std::move(profile), std::move(file));
}

std::unique_ptr<ComputeModel> analytic_compute(const TransformerShape& shape, double flops_per_s,
                                               double optimizer_s_per_param) {
  return std::make_unique<Analytic>(shape, flops_per_s, optimizer_s_per_param);
}

}  // namespace dtrain::plan
