// The rehearsal group; see rehearsal.h.
#include "comm/rehearsal.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "comm/detail/bounded_store.h"
#include "core/error.h"

namespace dtrain::comm {

namespace {

class Rehearsal final : public Backend {
 public:
  Rehearsal(std::string group_id, std::vector<int> ranks, int rank)
      : Backend("rehearsal", std::move(group_id), std::move(ranks), rank, std::chrono::minutes(10),
                c10::make_intrusive<BoundedStore>(c10::make_intrusive<c10d::HashStore>(),
                                                  "the rehearsal's in-process store",
                                                  std::chrono::minutes(10))) {}

 protected:
  static WorkPtr done(OpInfo info) { return std::make_shared<CompletedWork>(std::move(info)); }
  // Chunk g of a flat tensor cut by `counts`.
  static at::Tensor chunk(const at::Tensor& flat, const std::vector<int64_t>& counts, int g) {
    int64_t start = 0;
    for (int i = 0; i < g; ++i) start += counts[i];
    return flat.reshape({-1}).narrow(0, start, counts[g]);
  }
  std::vector<int64_t> equal(int64_t each) const { return std::vector<int64_t>(group_size(), each); }

  WorkPtr do_all_reduce(at::Tensor&, ReduceOp, OpInfo info) override { return done(std::move(info)); }
  WorkPtr do_reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op, OpInfo info) override {
    return do_reduce_scatter_v(output, input, equal(output.numel()), op, std::move(info));
  }
  WorkPtr do_reduce_scatter_v(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& counts,
                              ReduceOp, OpInfo info) override {
    output.reshape({-1}).copy_(chunk(input, counts, group_rank()));
    return done(std::move(info));
  }
  WorkPtr do_all_gather(at::Tensor& output, const at::Tensor& input, OpInfo info) override {
    return do_all_gather_v(output, input, equal(input.numel()), std::move(info));
  }
  WorkPtr do_all_gather_v(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& counts,
                          OpInfo info) override {
    const at::Tensor in = input.reshape({-1});
    for (int g = 0; g < group_size(); ++g) {
      at::Tensor slot = chunk(output, counts, g);
      slot.copy_(in.narrow(0, 0, std::min(slot.numel(), in.numel())).reshape(slot.sizes()).expand_as(slot));
    }
    return done(std::move(info));
  }
  WorkPtr do_broadcast(at::Tensor&, int, OpInfo info) override { return done(std::move(info)); }
  WorkPtr do_all_to_all_v(at::Tensor& output, const at::Tensor& input,
                          const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts,
                          OpInfo info) override {
    // every rank sends what this one sends: chunk g of the output is this rank's chunk for itself, cut or
    // padded to the size it expects
    const at::Tensor mine = chunk(input, send_counts, group_rank());
    for (int g = 0; g < group_size(); ++g) {
      at::Tensor slot = chunk(output, recv_counts, g);
      const int64_t k = std::min(slot.numel(), mine.numel());
      slot.zero_();
      slot.narrow(0, 0, k).copy_(mine.narrow(0, 0, k));
    }
    return done(std::move(info));
  }
  WorkPtr do_send(const at::Tensor&, int, int, OpInfo info) override { refuse(info); }
  WorkPtr do_recv(at::Tensor&, int, int, OpInfo info) override { refuse(info); }
  WorkPtr do_barrier(OpInfo info) override { return done(std::move(info)); }
  std::shared_ptr<Backend> do_split(int color, int, const std::vector<int>& members,
                                    const std::string& group_id) override {
    if (color < 0 || members.empty()) return nullptr;
    std::vector<int> ranks;
    int me = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      ranks.push_back(global_ranks()[members[i]]);
      if (members[i] == group_rank()) me = static_cast<int>(i);
    }
    return std::make_shared<Rehearsal>(group_id, ranks, me);
  }

 private:
  [[noreturn]] static void refuse(const OpInfo& info) {
    throw NotSupportedError(str_cat(describe(info),
                                    ": a rehearsal group moves nothing between processes, so it has no "
                                    "point-to-point ops. Measure a layout without them."));
  }
};

}  // namespace

std::shared_ptr<Backend> rehearsal_group(int size, int rank) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw ValueError(str_cat("rehearsal group: size ", size, " and rank ", rank,
                             " must satisfy 1 <= size and 0 <= rank < size."));
  }
  std::vector<int> ranks(size);
  for (int i = 0; i < size; ++i) ranks[i] = i;
  return std::make_shared<Rehearsal>("rehearsal", ranks, rank);
}

}  // namespace dtrain::comm
