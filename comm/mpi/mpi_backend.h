// The mpi backend: OpenMPI's blocking collectives (MPI_Allreduce, MPI_Reduce_scatter, MPI_Allgatherv,
// MPI_Alltoallv, ...) run in issue order on one communication thread per group
// (comm/mpi/detail/comm_thread.h), so they use OpenMPI's tuned algorithms while the caller's wait() keeps its
// deadline. (OpenMPI's non-blocking MPI_I* collectives run libnbc's algorithms, which progress only while
// polled: half the bandwidth at 64 MiB here.) bfloat16 and float16 reduce through user-defined MPI ops that
// accumulate each pair in float32. After a timed-out op the group's thread may stay blocked inside MPI: the
// group refuses further calls, MPI_Finalize is skipped, and the process should exit (the launcher stops the
// job).
#pragma once

#include <mpi.h>

#include <exception>
#include <functional>
#include <memory>

#include "comm/backend.h"

namespace dtrain::comm {

namespace detail {
class CommThread;
}

class MpiBackend : public Backend {
 public:
  // Initialises MPI (unless the program already did) and returns the world group. Rank 0 hosts the job's
  // key-value store (for progress reporting) on a free port, bound to loopback when every rank shares its
  // host, and shares its address and a fresh job secret over MPI (comm/detail/job_store.h); `store_host` is
  // the address the other ranks use to reach it on several hosts (empty: rank 0's host name).
  static std::shared_ptr<MpiBackend> create_world(std::chrono::milliseconds timeout,
                                                  const std::string& store_host);
  ~MpiBackend() override;

 protected:
  WorkPtr do_all_reduce(at::Tensor& tensor, ReduceOp op, OpInfo info) override;
  WorkPtr do_reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op, OpInfo info) override;
  WorkPtr do_reduce_scatter_v(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& counts,
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
  struct Environment;
  MpiBackend(std::shared_ptr<Environment> env, std::shared_ptr<detail::CommThread> thread, MPI_Comm comm,
             MPI_Comm p2p_comm, std::string group_id, std::vector<int> global_ranks, int group_rank,
             std::chrono::milliseconds timeout, c10::intrusive_ptr<BoundedStore> store);
  // Queues `call` on this group's communication thread; the lambda owns the tensors and count arrays it uses.
  WorkPtr submit(std::function<void()> call, OpInfo info);
  // Queues a non-blocking call that starts a request; the Work completes when the request does.
  WorkPtr submit_request(std::function<void(MPI_Request*)> start, std::vector<at::Tensor> keep, OpInfo info);

  std::shared_ptr<Environment> env_;
  std::shared_ptr<detail::CommThread> thread_;      // collectives on comm_, in issue order
  std::shared_ptr<detail::CommThread> p2p_thread_;  // send/recv on p2p_comm_; started on first use
  MPI_Comm comm_;
  // A duplicate of comm_ for send/recv, so that point-to-point traffic never queues behind a blocking
  // collective (a rank may send what a peer needs before it enters that collective).
  MPI_Comm p2p_comm_;
  // The first failed agreement of this group (set and read on thread_ only): later collectives rethrow it.
  std::shared_ptr<std::exception_ptr> disagreed_ = std::make_shared<std::exception_ptr>();
};

}  // namespace dtrain::comm
