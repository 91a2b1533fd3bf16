// The uneven collectives along one dim; see along_dim.h.
#include "comm/along_dim.h"

#include <ATen/ATen.h>

#include <numeric>

#include "core/error.h"
#include "core/log.h"

namespace dtrain::comm {

namespace {

// Elements in one row of `t` along `dim` (the product of the other sizes; a rank with no rows still knows
// it).
int64_t row_numel(const at::Tensor& t, int64_t dim) {
  int64_t n = 1;
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (i != dim) n *= t.size(i);
  }
  return n;
}

int64_t normalized(int64_t dim, const at::Tensor& t, const std::string& who) {
  const int64_t d = dim < 0 ? dim + t.dim() : dim;
  if (d < 0 || d >= t.dim()) {
    throw ValueError(str_cat(rank_prefix(), " ", who, ": dim ", dim,
                             " is out of range for a tensor of shape ", t.sizes(), ". Use a dim from ",
                             -t.dim(), " to ", t.dim() - 1, "."));
  }
  return d;
}

void check_lens(const BackendPtr& group, const std::vector<int64_t>& lens, const std::string& who) {
  if (static_cast<int64_t>(lens.size()) != group->group_size()) {
    throw ValueError(str_cat(rank_prefix(), " ", who, ": ", lens.size(), " row counts for a group of ",
                             group->group_size(), " ranks. Give one per rank."));
  }
}

// `flat` (dim first, flattened) back to `shape` with the rows at `dim`.
at::Tensor rows_back(const at::Tensor& flat, std::vector<int64_t> shape, int64_t dim) {
  std::rotate(shape.begin(), shape.begin() + dim, shape.begin() + dim + 1);
  return flat.view(shape).movedim(0, dim).contiguous();
}

}  // namespace

at::Tensor all_gather_along(const BackendPtr& group, const at::Tensor& x, int64_t dim,
                            const std::vector<int64_t>& lens, const std::string& who) {
  check_lens(group, lens, who);
  const int64_t d = normalized(dim, x, who), me = group->group_rank();
  if (x.size(d) != lens[me]) {
    throw ValueError(str_cat(rank_prefix(), " ", who, ": this rank holds ", x.size(d), " rows along dim ", d,
                             " of ", x.sizes(), " where the split gives it ", lens[me],
                             ". Every rank of the group must see the same input."));
  }
  const int64_t per_row = row_numel(x, d);
  std::vector<int64_t> counts;
  for (int64_t l : lens) counts.push_back(l * per_row);
  const int64_t total = std::accumulate(lens.begin(), lens.end(), int64_t{0});
  at::Tensor out = at::empty({total * per_row}, x.options());
  group->all_gather_v(out, x.movedim(d, 0).contiguous().view({-1}), counts)->wait();
  std::vector<int64_t> shape = x.sizes().vec();
  shape[d] = total;
  return rows_back(out, shape, d);
}

at::Tensor reduce_scatter_along(const BackendPtr& group, const at::Tensor& x, int64_t dim,
                                const std::vector<int64_t>& lens, ReduceOp op, const std::string& who) {
  check_lens(group, lens, who);
  const int64_t d = normalized(dim, x, who), me = group->group_rank();
  const int64_t total = std::accumulate(lens.begin(), lens.end(), int64_t{0});
  if (x.size(d) != total) {
    throw ValueError(str_cat(rank_prefix(), " ", who, ": the input has ", x.size(d), " rows along dim ", d,
                             " of ", x.sizes(), " where the parts add up to ", total,
                             ". Every rank must pass the whole tensor along the dim."));
  }
  const int64_t per_row = row_numel(x, d);
  std::vector<int64_t> counts;
  for (int64_t l : lens) counts.push_back(l * per_row);
  at::Tensor out = at::empty({counts[me]}, x.options());
  ReduceScatterOptions o;
  o.op = op;
  group->reduce_scatter_v(out, x.movedim(d, 0).contiguous().view({-1}), counts, o)->wait();
  std::vector<int64_t> shape = x.sizes().vec();
  shape[d] = lens[me];
  return rows_back(out, shape, d);
}

}  // namespace dtrain::comm
