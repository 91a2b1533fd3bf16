// Shard arithmetic; see shard_math.h.
#include "tensor/shard_math.h"

#include <algorithm>

#include "core/balanced_split.h"
#include "core/error.h"

namespace dtrain::tensor {

int64_t shard_size(int64_t n, int64_t k, int64_t r) { return balanced_part(n, k, r).count; }

int64_t shard_offset(int64_t n, int64_t k, int64_t r) { return balanced_part(n, k, r).start; }

LocalChunk local_chunk(const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh_shape,
                       const Placements& placements, const std::vector<int64_t>& coordinate) {
  LocalChunk c{shape, std::vector<int64_t>(shape.size(), 0)};
  for (size_t a = 0; a < placements.size(); ++a) {
    if (!placements[a].is_shard()) continue;
    int d = placements[a].dim;
    c.offset[d] += shard_offset(c.shape[d], mesh_shape[a], coordinate[a]);
    c.shape[d] = shard_size(c.shape[d], mesh_shape[a], coordinate[a]);
  }
  return c;
}

std::vector<int64_t> max_local_shape(const std::vector<int64_t>& shape,
                                     const std::vector<int64_t>& mesh_shape, const Placements& placements) {
  std::vector<int64_t> s = shape;
  for (size_t a = 0; a < placements.size(); ++a) {
    if (placements[a].is_shard()) s[placements[a].dim] = shard_size(s[placements[a].dim], mesh_shape[a], 0);
  }
  return s;
}

std::string mixed_partials(const Placements& placements) {
  const Placement* linear = nullptr;  // the first sum/avg axis
  const Placement* order = nullptr;   // the first max/min axis
  for (const auto& p : placements) {
    if (!p.is_partial()) continue;
    if (p.op == ReduceOp::kSum || p.op == ReduceOp::kAvg) {
      if (!linear) linear = &p;
    } else if (!order) {
      order = &p;
    } else if (order->op != p.op) {
      return str_cat(order->to_string(), " with ", p.to_string());
    }
  }
  if (linear && order) return str_cat(linear->to_string(), " with ", order->to_string());
  return "";
}

int64_t storage_extent(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                       int64_t offset) {
  int64_t end = offset + 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return offset;
    end += (sizes[d] - 1) * strides[d];
  }
  return end;
}

Placements check_placements(const char* who, const Placements& placements, int64_t ndim, int64_t mesh_ndim) {
  if (static_cast<int64_t>(placements.size()) != mesh_ndim) {
    throw ValueError(str_cat(who, ": ", placements.size(), " placements ", to_string(placements), " for a ",
                             mesh_ndim, "-d mesh. Give one placement per mesh axis."));
  }
  if (std::string mix = mixed_partials(placements); !mix.empty()) {
    throw NotSupportedError(
        str_cat(who, ": ", to_string(placements), " mixes ", mix,
                " on different mesh axes: their reductions do not commute, so the tensor "
                "would have a different value for each order of reducing the axes. Reduce "
                "one of them first (redistribute that axis to Replicate()), or use one kind "
                "(sum and avg mix freely)."));
  }
  Placements out = placements;
  for (auto& p : out) {
    if (!p.is_shard()) continue;
    int d = p.dim < 0 ? static_cast<int>(p.dim + ndim) : p.dim;
    if (d < 0 || d >= ndim) {
      std::string options;
      for (int64_t i = 0; i < ndim; ++i) options += str_cat(i ? ", " : "", "Shard(", i, ")");
      throw ValueError(str_cat(who, ": Shard(", p.dim, ") is invalid for a ", ndim, "-d tensor",
                               ndim > 0 ? str_cat(" (dims 0..", ndim - 1, ")") : std::string(), ". Use ",
                               options, options.empty() ? "" : " or ", "Replicate()."));
    }
    p.dim = d;
  }
  return out;
}

}  // namespace dtrain::tensor
