// The redistribution executor; see redistribute.h.
//
// Each step works on one mesh axis `a` of size k, with this rank at coordinate c on it. For a dim d that the
// axis shards (before or after the step), n is the size of the block the axis group holds together along d,
// and rank r holds rows [shard_offset(n, k, r), +shard_size(n, k, r)) of it. Collectives run on the flattened
// tensor with the sharded dim moved to the front, so each rank's rows are one contiguous run.
#include "tensor/redistribute.h"

#include <ATen/ATen.h>

#include <chrono>
#include <numeric>
#include <optional>

#include "comm/along_dim.h"
#include "comm/comm_log.h"
#include "core/balanced_split.h"
#include "core/error.h"
#include "core/log.h"
#include "tensor/shard_math.h"

namespace dtrain::tensor {

namespace {

class Runner {
 public:
  Runner(const mesh::DeviceMesh& mesh, std::vector<IssuedCollective>* issued)
      : mesh_(mesh), issued_(issued) {}

  at::Tensor step(const at::Tensor& x, const RedistributeStep& s, const std::vector<int64_t>& global_shape) {
    const int a = s.axis;
    const int64_t k = mesh_.size(a), c = mesh_.coordinate()[a];
    // Block sizes of the axis group: the local chunk as if this axis did not shard.
    Placements without = s.after;
    without[a] = Replicate();
    std::vector<int64_t> block = local_chunk(global_shape, mesh_.shape(), without, mesh_.coordinate()).shape;
    if (k == 1) return x;  // every step on a size-1 axis is a relabelling
    const auto& group = mesh_.axis_group(a);
    comm::CommCause cause(a, s.seconds);  // the step's collective goes into CommLog with its planned cost
    switch (s.kind) {
      case StepKind::kAllGather: {
        const int d = s.from.dim;
        record(s, x);
        return comm::all_gather_along(group, x, d, balanced_counts(block[d], k), "redistribute");
      }
      case StepKind::kAllReduce: {
        at::Tensor y = x.contiguous().clone();
        record(s, y);
        group->all_reduce(y, {s.from.op})->wait();
        return y;
      }
      case StepKind::kReduceScatter: {
        const int d = s.to.dim;
        record(s, x);
        return comm::reduce_scatter_along(group, x, d, balanced_counts(block[d], k), s.from.op,
                                          "redistribute");
      }
      case StepKind::kAllToAll: {
        // Before: rows of dim i are sharded (mine: shard c of block[i]), dim j is whole (block[j]).
        // After: dim i whole, dim j sharded. Send to rank r my rows x its slice of j; receive r's rows x my
        // slice.
        int i = s.from.dim, j = s.to.dim;
        int64_t ni = block[i], nj = x.size(j);
        std::vector<at::Tensor> pieces;
        std::vector<int64_t> send(k), recv(k);
        int64_t other = 1;  // elements per (row of i, row of j)
        for (int64_t e = 0; e < x.dim(); ++e) {
          if (e != i && e != j) other *= x.size(e);
        }
        for (int64_t r = 0; r < k; ++r) {
          at::Tensor piece = x.narrow(j, shard_offset(nj, k, r), shard_size(nj, k, r));
          pieces.push_back(piece.contiguous().view({-1}));
          send[r] = piece.numel();
          recv[r] = shard_size(ni, k, r) * shard_size(nj, k, c) * other;
        }
        at::Tensor in = at::cat(pieces);
        at::Tensor out = at::empty({std::accumulate(recv.begin(), recv.end(), int64_t{0})}, x.options());
        record(s, in);
        group->all_to_all_v(out, in, send, recv)->wait();
        std::vector<at::Tensor> parts;
        int64_t off = 0;
        for (int64_t r = 0; r < k; ++r) {
          std::vector<int64_t> shape = x.sizes().vec();
          shape[i] = shard_size(ni, k, r);
          shape[j] = shard_size(nj, k, c);
          parts.push_back(out.narrow(0, off, recv[r]).view(shape));
          off += recv[r];
        }
        return at::cat(parts, i);
      }
      case StepKind::kLocalSlice: {
        int d = s.to.dim;
        return x.narrow(d, shard_offset(x.size(d), k, c), shard_size(x.size(d), k, c)).contiguous();
      }
      case StepKind::kLocalPartial:
        if (s.to.op == ReduceOp::kSum && c != 0) return at::zeros_like(x);
        return x;
      case StepKind::kLocalScale:
        if (!at::isFloatingType(x.scalar_type())) {
          throw ValueError(str_cat(rank_prefix(), " redistribute: ", s.from.to_string(), " -> ",
                                   s.to.to_string(), " on ", x.scalar_type(),
                                   " would truncate. Use a floating dtype or Partial(sum)."));
        }
        return s.to.op == ReduceOp::kAvg ? x * static_cast<double>(k) : x / static_cast<double>(k);
    }
    DTRAIN_ASSERT(false, "unknown step kind");
    return x;
  }

 private:
  // Notes the collective about to run for the caller's list (CommLog records it where it is issued).
  void record(const RedistributeStep& s, const at::Tensor& contributed) {
    if (issued_) issued_->push_back({s.kind, s.axis, contributed.numel() * contributed.element_size()});
  }

  const mesh::DeviceMesh& mesh_;
  std::vector<IssuedCollective>* issued_;
};

}  // namespace

at::Tensor run_redistribute(const at::Tensor& local, const mesh::DeviceMesh& mesh,
                            const RedistributePlan& plan, std::vector<IssuedCollective>* issued) {
  if (mesh.shape() != plan.problem.mesh_shape) {
    throw ValueError(str_cat(rank_prefix(), " redistribute: the plan is for a mesh of shape ",
                             c10::IntArrayRef(plan.problem.mesh_shape), " but runs on ", mesh.to_string(),
                             ". Plan with this mesh's shape."));
  }
  auto expect = local_chunk(plan.problem.shape, mesh.shape(), plan.problem.from, mesh.coordinate()).shape;
  if (local.sizes().vec() != expect) {
    throw ValueError(str_cat(rank_prefix(), " redistribute: the local block has shape ", local.sizes(),
                             " but ", to_string(plan.problem.from), " of a tensor of shape ",
                             c10::IntArrayRef(plan.problem.shape), " gives this rank ",
                             c10::IntArrayRef(expect), ". Pass this rank's block (see local_block)."));
  }
  // The engines move six dtypes; bool and small integers (masks, token ids) travel widened to int32, exactly.
  const auto dtype = local.scalar_type();
  const bool widen = dtype == at::kBool || dtype == at::kByte || dtype == at::kChar || dtype == at::kShort;
  Runner runner(mesh, issued);
  at::Tensor x = widen ? local.to(at::kInt) : local;
  for (const auto& s : plan.steps) {
    x = runner.step(x, s, plan.problem.shape);
  }
  return widen ? x.to(dtype) : x;
}

at::Tensor local_block(const at::Tensor& full, const std::vector<int64_t>& mesh_shape,
                       const Placements& placements, const std::vector<int64_t>& coordinate) {
  LocalChunk chunk = local_chunk(full.sizes().vec(), mesh_shape, placements, coordinate);
  at::Tensor x = full;
  for (int64_t d = 0; d < full.dim(); ++d) x = x.narrow(d, chunk.offset[d], chunk.shape[d]);
  for (size_t a = 0; a < placements.size(); ++a) {
    if (placements[a].is_partial() && placements[a].op == ReduceOp::kSum && coordinate[a] != 0) {
      return at::zeros_like(x).contiguous();
    }
  }
  return x.contiguous();
}

}  // namespace dtrain::tensor
