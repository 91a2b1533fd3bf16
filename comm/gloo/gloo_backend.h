// The gloo backend: libtorch's c10d ProcessGroupGloo (Gloo over TCP) behind dtrain's Backend interface.
// Composed collectives: all_gather(_v) is one broadcast per rank, in place in the output (no temporary);
// reduce_scatter_v moves per-rank chunks padded to the largest count in internal buffers (the caller never
// sees the padding), and a reduce-scatter whose input is scratch is an all-reduce in that input, with no copy
// of it; all_to_all_v maps to Gloo's alltoallv.
#pragma once

#include "comm/backend.h"
#include "comm/detail/completion.h"
#include "comm/detail/serial_thread.h"
#include "comm/detail/shm_agreement.h"
#include "core/env.h"

namespace c10d {
class ProcessGroupGloo;
class Work;
}  // namespace c10d

namespace dtrain::comm {

// For a job spanning several hosts (not single_host_job(env)) without GLOO_SOCKET_IFNAME: Gloo advertises
// the address `hostname` resolves to, and when that is a loopback address the other hosts cannot connect.
// Returns the error to raise (naming GLOO_SOCKET_IFNAME and this host's interfaces), or "" when there is no
// such problem.
std::string loopback_advertise_problem(const EnvMap& env, const std::string& hostname);

class GlooBackend : public Backend {
 public:
  // Connects `size` ranks through `store` (a c10d TCPStore, or a PrefixStore for a sub-group). Collective:
  // every rank of the group calls it. `global_ranks` maps group ranks to global ranks.
  static std::shared_ptr<GlooBackend> create(c10::intrusive_ptr<BoundedStore> store, std::string group_id,
                                             std::vector<int> global_ranks, int group_rank,
                                             std::chrono::milliseconds timeout);
  ~GlooBackend() override;

 protected:
  WorkPtr do_all_reduce(at::Tensor& tensor, ReduceOp op, OpInfo info) override;
  WorkPtr do_reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op, OpInfo info) override;
  WorkPtr do_reduce_scatter_v(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& counts,
                              ReduceOp op, OpInfo info) override;
  WorkPtr do_reduce_scatter_scratch(at::Tensor& output, at::Tensor& input, const std::vector<int64_t>& counts,
                                    ReduceOp op, OpInfo info) override;
  WorkPtr do_all_gather(at::Tensor& output, const at::Tensor& input, OpInfo info) override;
  WorkPtr do_all_gather_v(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& counts,
                          OpInfo info) override;
  WorkPtr do_broadcast(at::Tensor& tensor, int root, OpInfo info) override;
  WorkPtr do_all_to_all_v(at::Tensor& output, const at::Tensor& input,
                          const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts,
                          OpInfo info) override;
  WorkPtr do_send(const at::Tensor& tensor, int dst, int tag, OpInfo info) override;
  WorkPtr do_recv(at::Tensor& tensor, int src, int tag, OpInfo info) override;
  WorkPtr do_barrier(OpInfo info) override;
  std::shared_ptr<Backend> do_split(int color, int key, const std::vector<int>& members,
                                    const std::string& group_id) override;

 private:
  GlooBackend(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, c10::intrusive_ptr<BoundedStore> store,
              std::string group_id, std::vector<int> global_ranks, int group_rank,
              std::chrono::milliseconds timeout, std::unique_ptr<ShmAgreement> shm);

  // Issues a collective: at once when it carries no signature, else once the ranks agreed on it (Backend's
  // agreement check): through shared memory when the group has it (on the caller's thread when the others
  // are there within a moment, else on the issuer thread), else through an all_gather on c10d's thread.
  WorkPtr issue(OpInfo info, std::function<c10::intrusive_ptr<c10d::Work>()> start);
  WorkPtr issue_engine_agreement(OpInfo info, std::function<c10::intrusive_ptr<c10d::Work>()> start);
  WorkPtr issue_shm_agreement(OpInfo info, std::function<c10::intrusive_ptr<c10d::Work>()> start);
  // The collective's number in the group's issue order (*n), and whether every earlier one has settled (it
  // may then be queued at once; an unsigned one is counted as started); otherwise the issuer thread is owed
  // it. Rethrows an earlier disagreement; refuses in a failing process.
  bool take_turn(const OpInfo& info, bool signed_op, uint64_t* n);

  // Waits for a c10d send/recv Work on the waiter thread (see gloo_backend.cpp); the Completion says when.
  std::shared_ptr<Completion> wait_in_order(c10::intrusive_ptr<c10d::Work> work, Clock::time_point deadline);

  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::unique_ptr<SerialThread> waiter_;  // send/recv waits; started on first use; destroyed before pg_
  struct Sequencer;
  std::shared_ptr<Sequencer> sequencer_;  // the issue order of signed collectives
  int issuer_pending_ = 0;  // guarded by sequencer_->mu: collectives the issuer has yet to queue
  // The agreement board when every rank of the group shares this host (nullptr: Gloo's all_gather); used by
  // the issuer thread, so destroyed after it.
  std::shared_ptr<ShmAgreement> shm_;  // (shared with the ops' dead-peer checks, which outlive none of it)
  std::shared_ptr<std::atomic<bool>> closing_ = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<SerialThread> issuer_;  // queues collectives issued before earlier ones settled; destroyed
                                          // before pg_
};

}  // namespace dtrain::comm
