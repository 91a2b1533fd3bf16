// Backend: the communication interface of dtrain (c10d's shape: collective + options struct + Work). The
// public methods validate their arguments once, number the collective, stage non-contiguous tensors through
// contiguous buffers, and hand contiguous tensors to the engine hooks that each backend (comm/mpi, comm/gloo)
// implements.
//
// Tensors: CPU; float32, float64, bfloat16, float16, int32, int64. Counts are element counts of the flattened
// tensors. Variable-size collectives take one count per group rank, zeros allowed.
//
// Thread-safety: a Backend is used by one thread at a time (MPI_THREAD_SERIALIZED semantics). Every rank of
// the group must issue the same collectives in the same order; a rank that does not is named in the
// TimeoutError of its peers.
//
// Agreement: before a collective's data reaches the engine, the ranks exchange its signature (which
// collective, dtype, element count or counts, reduce op, root; OpInfo::signature): in one small all_gather on
// the backend's own thread, or (Gloo, every rank on this host) through a shared-memory board (ShmAgreement),
// so that the call stays asynchronous. Ranks that disagree raise a ValueError on every rank (from wait())
// naming the rank that differs and what differs, instead of the engine aborting the process (Gloo) or
// returning a wrong result (same bytes, other dtype; another root). A run of collectives (AgreementRun, e.g.
// a step's gradient buckets) is checked once, at its first collective.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include <c10/util/intrusive_ptr.h>

#include "comm/types.h"
#include "comm/work.h"

namespace dtrain::comm {

class BoundedStore;   // comm/detail/bounded_store.h
class ProgressBoard;  // comm/detail/progress_board.h
class FailureBoard;   // comm/detail/failure_board.h

class Backend : public std::enable_shared_from_this<Backend> {
 public:
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  const std::string& name() const { return name_; }
  // This process's rank in the group and the group's size.
  int group_rank() const { return group_rank_; }
  int group_size() const { return static_cast<int>(global_ranks_.size()); }
  // Global rank of each group rank.
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  int global_rank() const { return global_ranks_[group_rank_]; }
  // "world", or a sub-group id such as "world.0.c1".
  const std::string& group_id() const { return group_id_; }
  std::chrono::milliseconds default_timeout() const { return default_timeout_; }

  // In place: every rank ends with op over all ranks' `tensor`. avg is sum / group_size, floating dtypes
  // only.
  WorkPtr all_reduce(at::Tensor& tensor, const AllReduceOptions& opts = {});
  // `input` holds group_size equal chunks; `output` (input.numel() / group_size elements) gets this rank's
  // reduced chunk.
  WorkPtr reduce_scatter(at::Tensor& output, const at::Tensor& input, const ReduceScatterOptions& opts = {});
  // `input` is the concatenation of chunks of counts[g] elements; `output` (counts[group_rank] elements) gets
  // this rank's reduced chunk.
  WorkPtr reduce_scatter_v(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& counts,
                           const ReduceScatterOptions& opts = {});
  // `output` (group_size * input.numel() elements) gets every rank's input, in group-rank order.
  WorkPtr all_gather(at::Tensor& output, const at::Tensor& input, const AllGatherOptions& opts = {});
  // Rank g contributes counts[g] elements (its input.numel() must equal counts[group_rank]); `output` has
  // sum(counts).
  WorkPtr all_gather_v(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& counts,
                       const AllGatherOptions& opts = {});
  // In place: every rank ends with the root's `tensor`.
  WorkPtr broadcast(at::Tensor& tensor, const BroadcastOptions& opts = {});
  // `input` and `output` hold group_size equal chunks; chunk g of input goes to rank g, chunk g of output
  // came from g.
  WorkPtr all_to_all(at::Tensor& output, const at::Tensor& input, const AllToAllOptions& opts = {});
  // send_counts[g] elements of input go to rank g; recv_counts[g] elements of output come from rank g.
  WorkPtr all_to_all_v(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& send_counts,
                       const std::vector<int64_t>& recv_counts, const AllToAllOptions& opts = {});
  WorkPtr send(const at::Tensor& tensor, int dst, const SendOptions& opts = {});
  WorkPtr recv(at::Tensor& tensor, int src, const RecvOptions& opts = {});
  WorkPtr barrier(const BarrierOptions& opts = {});

  // Tells every rank of the job that this one failed at `tag` with `message` (FailureBoard): their waiting
  // collectives raise it within FailureBoard::kPollInterval. Never throws.
  void report_failure(const std::string& tag, const std::string& message);

  // Collective over this group: ranks with the same color form a new group, ordered by (key, group rank). A
  // negative color joins no group and gets nullptr.
  std::shared_ptr<Backend> split(int color, int key);

 protected:
  Backend(std::string name, std::string group_id, std::vector<int> global_ranks, int group_rank,
          std::chrono::milliseconds default_timeout, c10::intrusive_ptr<BoundedStore> store);

  // Engine hooks: contiguous CPU tensors of a supported dtype, arguments already checked; op is never kAvg.
  virtual WorkPtr do_all_reduce(at::Tensor& tensor, ReduceOp op, OpInfo info) = 0;
  virtual WorkPtr do_reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                    OpInfo info) = 0;
  virtual WorkPtr do_reduce_scatter_v(at::Tensor& output, const at::Tensor& input,
                                      const std::vector<int64_t>& counts, ReduceOp op, OpInfo info) = 0;
  // The same, where the input may be overwritten (ReduceScatterOptions::input_is_scratch): by default
  // do_reduce_scatter_v.
  virtual WorkPtr do_reduce_scatter_scratch(at::Tensor& output, at::Tensor& input,
                                            const std::vector<int64_t>& counts, ReduceOp op, OpInfo info);
  virtual WorkPtr do_all_gather(at::Tensor& output, const at::Tensor& input, OpInfo info) = 0;
  virtual WorkPtr do_all_gather_v(at::Tensor& output, const at::Tensor& input,
                                  const std::vector<int64_t>& counts, OpInfo info) = 0;
  virtual WorkPtr do_broadcast(at::Tensor& tensor, int root, OpInfo info) = 0;
  virtual WorkPtr do_all_to_all_v(at::Tensor& output, const at::Tensor& input,
                                  const std::vector<int64_t>& send_counts,
                                  const std::vector<int64_t>& recv_counts, OpInfo info) = 0;
  virtual WorkPtr do_send(const at::Tensor& tensor, int dst, int tag, OpInfo info) = 0;
  virtual WorkPtr do_recv(at::Tensor& tensor, int src, int tag, OpInfo info) = 0;
  virtual WorkPtr do_barrier(OpInfo info) = 0;
  // Creates the engine's group for `members` (group ranks of this group, in new-rank order) under id
  // `group_id`. Called by every rank of this group; ranks with color < 0 get members empty and return
  // nullptr.
  virtual std::shared_ptr<Backend> do_split(int color, int key, const std::vector<int>& members,
                                            const std::string& group_id) = 0;

  const c10::intrusive_ptr<BoundedStore>& store() const { return store_; }

 private:
  OpInfo begin(const char* op, std::vector<int> peers, const Timeout& timeout, bool collective);
  // Sets info->signature for an agreement check (see the class comment).
  static void sign(OpInfo* info, int64_t kind, const at::Tensor& t, int64_t total, int64_t counts_hash,
                   int64_t op, int64_t root);
  // sign(), or for a member of an AgreementRun: the first carries the run's fingerprint, the others nothing.
  static void sign_in_run(OpInfo* info, const AgreementRun& run, int64_t kind, const at::Tensor& t,
                          int64_t total, int64_t counts_hash, int64_t op, int64_t root);
  void check_tensor(const char* op, const char* what, const at::Tensor& t) const;
  void check_counts(const char* op, const char* what, const std::vector<int64_t>& counts) const;
  void check_peer(const char* op, const char* what, int peer) const;
  std::vector<int> all_peers() const;

  std::string name_;
  std::string group_id_;
  std::vector<int> global_ranks_;
  int group_rank_;
  std::chrono::milliseconds default_timeout_;
  c10::intrusive_ptr<BoundedStore> store_;
  std::shared_ptr<ProgressBoard> board_;
  std::shared_ptr<FailureBoard> failures_;
  uint64_t collective_seq_ = 0;
  uint64_t p2p_seq_ = 0;
  int splits_ = 0;
};

using BackendPtr = std::shared_ptr<Backend>;

// Element size and name checks shared by the backends.
bool is_supported_dtype(at::ScalarType t);

}  // namespace dtrain::comm
