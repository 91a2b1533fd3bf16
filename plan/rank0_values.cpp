// take_rank0_values; see detail/rank0_values.h.
#include "plan/detail/rank0_values.h"

#include <ATen/ATen.h>

#include "core/error.h"

namespace dtrain::plan::detail {

void take_rank0_values(std::vector<double>& values, comm::Backend& group, const std::string& caller,
                       const std::string& what, const std::string& fix) {
  const int64_t n = static_cast<int64_t>(values.size());
  at::Tensor counts = at::zeros({group.group_size()}, at::kLong);
  counts[group.group_rank()] = n;
  group.all_reduce(counts)->wait();
  for (int r = 0; r < group.group_size(); ++r) {
    const int64_t theirs = counts[r].item<int64_t>();
    if (theirs != n) {
      throw ValueError(str_cat(caller, ": rank ", r, " has ", theirs, " ", what, " and rank ",
                               group.group_rank(), " ", n, ": ", fix));
    }
  }
  at::Tensor t = at::from_blob(values.data(), {n}, at::kDouble).clone();
  group.broadcast(t)->wait();
  std::copy(t.data_ptr<double>(), t.data_ptr<double>() + n, values.begin());
}

}  // namespace dtrain::plan::detail
