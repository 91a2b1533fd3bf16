// CostModel; see cost_model.h.
#include "tensor/cost_model.h"

#include "core/error.h"

namespace dtrain::tensor {

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

}  // namespace dtrain::tensor
