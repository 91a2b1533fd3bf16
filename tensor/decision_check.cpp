// Check mode's decision check; see detail/decision_check.h.
#include "tensor/detail/decision_check.h"

#include <ATen/ATen.h>

#include <map>

#include "comm/comm_log.h"
#include "core/error.h"
#include "core/log.h"
#include "tensor/detail/dispatch_util.h"

namespace dtrain::tensor::detail {

namespace {

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// "[7, 5] strides [5, 1] Float (S(0), R)": what an op's decision depends on for one DTensor argument.
std::string describe_arg(const at::Tensor& t) {
  return str_cat(t.sizes(), " strides ", t.strides(), " ", t.scalar_type(), " ",
                 to_string(meta_of(t).placements));
}

}  // namespace

void DecisionCheck::add_plain(const at::Tensor& t, size_t arg) {
  at::Tensor c = t.contiguous();
  uint64_t h = fnv1a(c.sizes().data(), c.sizes().size() * sizeof(int64_t), plain ? plain : 7);
  h = fnv1a(c.const_data_ptr(), static_cast<size_t>(c.numel()) * c.element_size(), h);
  plain = h | 1;  // never 0
  plain_what += str_cat(plain_what.empty() ? "" : ", ", "argument ", arg, " ", t.sizes());
}

void DecisionCheck::verify(const c10::OperatorHandle& op, const MeshPtr& mesh,
                           const std::vector<std::pair<size_t, at::Tensor>>& dts,
                           const std::string& decision) const {
  if (!decisions && plain == 0) return;
  std::string what;
  if (decisions) {
    what = op_name(op) + ": " + decision;
    for (const auto& [i, t] : dts) what += " | " + describe_arg(t);
  }
  const auto& group = mesh->group();
  const int n = group->group_size();
  at::Tensor mine = at::tensor(
      {static_cast<int64_t>(decisions ? fnv1a(what.data(), what.size()) : 0), static_cast<int64_t>(plain)},
      at::kLong);
  at::Tensor all = at::empty({n, 2}, at::kLong);
  {
    comm::NotLogged unlogged;  // a check, not the op's communication
    group->all_gather(all, mine)->wait();
  }
  auto differ = [&](int col) {
    std::map<int64_t, std::vector<int>> sides;
    for (int g = 0; g < n; ++g) sides[all[g][col].item<int64_t>()].push_back(group->global_ranks()[g]);
    if (sides.size() <= 1) return std::string();
    std::string out;
    for (const auto& [h, ranks] : sides) {
      std::string list;
      for (int r : ranks) list += str_cat(list.empty() ? "" : ", ", r);
      const bool mine_side = h == mine[col].item<int64_t>();
      out += str_cat(out.empty() ? "" : " vs ", "ranks {", list, "}", mine_side ? " (this rank)" : "");
    }
    return out;
  };
  if (std::string d = differ(0); !d.empty()) {
    throw ValueError(str_cat(rank_prefix(), " DTRAIN_DTENSOR_CHECK: the ranks decided differently for ",
                             op_name(op), ": ", d, ". This rank decided: ", what,
                             ". Every decision must depend on global shapes, strides, placements and dtypes "
                             "only; report this with the op and placements."));
  }
  if (std::string d = differ(1); !d.empty()) {
    throw ValueError(str_cat(
        rank_prefix(), " DTensor: ", op_name(op), " got a plain tensor (", plain_what,
        ") that differs across ranks: ", d,
        ". A plain tensor meeting a DTensor is taken as Replicate, the same on every rank. Make "
        "rank-specific "
        "values a DTensor with from_local() (Shard or Partial), or compute them alike on every rank."));
  }
}

}  // namespace dtrain::tensor::detail
