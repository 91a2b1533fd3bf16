// The gloo backend; see gloo_backend.h.
#include "comm/gloo/gloo_backend.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include "comm/completion.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

namespace dtrain::comm {

namespace {

// Gloo's own deadline sits a little after ours, so that a stuck collective surfaces as dtrain's TimeoutError
// (which names the missing ranks) rather than as Gloo's I/O error, while a torn-down group still frees its
// threads soon.
constexpr auto kGlooGrace = std::chrono::milliseconds(1000);

c10d::ReduceOp c10d_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
    case ReduceOp::kAvg:
      break;
  }
  DTRAIN_ASSERT(false, "avg reached the gloo backend");
  return c10d::ReduceOp::SUM;
}

class GlooWork : public Work {
 public:
  GlooWork(OpInfo info, c10::intrusive_ptr<c10d::Work> work)
      : Work(std::move(info)), work_(std::move(work)) {}

 protected:
  bool poll() override {
    if (!work_->isCompleted()) return false;
    if (!work_->isSuccess()) std::rethrow_exception(work_->exception());
    return true;
  }

  bool wait_until(Clock::time_point deadline) override {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return poll();
    try {
      work_->wait(left);
    } catch (...) {
      // c10d reports its own timeout as an exception too: only a completed work carries an engine error.
      if (!work_->isCompleted()) return false;
      throw;
    }
    return true;
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
};

}  // namespace

// Waits for c10d's send/recv Works on a thread of its own, in issue order. Their isCompleted() only turns
// true inside wait(), and a timed wait() on them that expires closes every connection of the group, so a
// caller's short wait must never reach them: the waiter waits once, up to the op's own deadline, and the
// caller waits on the waiter.
class GlooBackend::P2pWaiter {
 public:
  P2pWaiter() : thread_([this] { loop(); }) {}
  ~P2pWaiter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();  // each queued wait ends by its op's deadline
  }

  std::shared_ptr<Completion> add(c10::intrusive_ptr<c10d::Work> work, Clock::time_point deadline) {
    auto state = std::make_shared<Completion>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({std::move(work), deadline, state});
    }
    cv_.notify_one();
    return state;
  }

 private:
  struct Item {
    c10::intrusive_ptr<c10d::Work> work;
    Clock::time_point deadline;
    std::shared_ptr<Completion> state;
  };

  void loop() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(item.deadline - Clock::now());
        item.work->wait(std::max(left, std::chrono::milliseconds(1)) + kGlooGrace);
      } catch (...) {
        error = std::current_exception();
      }
      item.state->finish(error);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;  // guarded by mu_
  bool stop_ = false;       // guarded by mu_
  std::thread thread_;
};

namespace {

std::shared_ptr<::gloo::transport::Device> make_device() {
  const EnvMap env = current_env();
  if (auto ifname = env_get(env, "GLOO_SOCKET_IFNAME"); ifname && !ifname->empty()) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(*ifname);
  }
  std::string a = env_get(env, "MASTER_ADDR").value_or("");
  if (a.empty() || a == "127.0.0.1" || a == "localhost") {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// Copies `counts`-sized chunks of `flat` into rows of a [k, max] buffer (or back), for padded collectives.
at::Tensor pad_chunks(const at::Tensor& flat, const std::vector<int64_t>& counts, int64_t max) {
  at::Tensor padded = at::zeros({static_cast<int64_t>(counts.size()), max}, flat.options());
  int64_t off = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] > 0) padded[g].narrow(0, 0, counts[g]).copy_(flat.narrow(0, off, counts[g]));
    off += counts[g];
  }
  return padded;
}

void unpad_chunks(const at::Tensor& padded, const std::vector<int64_t>& counts, at::Tensor& flat) {
  int64_t off = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] > 0) flat.narrow(0, off, counts[g]).copy_(padded[g].narrow(0, 0, counts[g]));
    off += counts[g];
  }
}

}  // namespace

std::shared_ptr<GlooBackend> GlooBackend::create(c10::intrusive_ptr<c10d::Store> store, std::string group_id,
                                                 std::vector<int> global_ranks, int group_rank,
                                                 std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->timeout = timeout + kGlooGrace;
  opts->devices.push_back(make_device());
  opts->threads = 2;
  opts->global_ranks_in_group.assign(global_ranks.begin(), global_ranks.end());
  opts->group_name = group_id;
  int size = static_cast<int>(global_ranks.size());
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(str_cat("dtrain/gloo/", group_id), store);
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  try {
    pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, group_rank, size, opts);
  } catch (const std::exception& e) {
    throw CommError(str_cat(rank_prefix(), " gloo: connecting group ", group_id, " (", size,
                            " ranks) failed: ", e.what(),
                            " Check that every rank started and that MASTER_ADDR/MASTER_PORT reach rank 0."));
  }
  return std::shared_ptr<GlooBackend>(new GlooBackend(pg, std::move(store), std::move(group_id),
                                                      std::move(global_ranks), group_rank, timeout));
}

GlooBackend::GlooBackend(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, c10::intrusive_ptr<c10d::Store> store,
                         std::string group_id, std::vector<int> global_ranks, int group_rank,
                         std::chrono::milliseconds timeout)
    : Backend("gloo", std::move(group_id), std::move(global_ranks), group_rank, timeout, std::move(store)),
      pg_(std::move(pg)) {}

GlooBackend::~GlooBackend() = default;

GlooBackend::P2pWaiter* GlooBackend::waiter() {
  if (!waiter_) waiter_ = std::make_unique<P2pWaiter>();
  return waiter_.get();
}

namespace {
std::chrono::milliseconds gloo_timeout(const OpInfo& info) { return info.timeout + kGlooGrace; }
}  // namespace

WorkPtr GlooBackend::do_all_reduce(at::Tensor& t, ReduceOp op, OpInfo info) {
  c10d::AllreduceOptions o;
  o.reduceOp = c10d_op(op);
  o.timeout = gloo_timeout(info);
  std::vector<at::Tensor> ts{t};
  return std::make_shared<GlooWork>(std::move(info), pg_->allreduce(ts, o));
}

WorkPtr GlooBackend::do_reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op, OpInfo info) {
  c10d::ReduceScatterOptions o;
  o.reduceOp = c10d_op(op);
  o.timeout = gloo_timeout(info);
  at::Tensor input = in;
  return std::make_shared<GlooWork>(std::move(info), pg_->_reduce_scatter_base(out, input, o));
}

WorkPtr GlooBackend::do_reduce_scatter_v(at::Tensor& out, const at::Tensor& in,
                                         const std::vector<int64_t>& counts, ReduceOp op, OpInfo info) {
  int64_t max = *std::max_element(counts.begin(), counts.end());
  at::Tensor padded_in = pad_chunks(in, counts, max).view({-1});
  at::Tensor padded_out = at::empty({max}, in.options());
  int64_t mine = counts[group_rank()];
  WorkPtr w = do_reduce_scatter(padded_out, padded_in, op, std::move(info));
  at::Tensor target = out;
  w->then([padded_out, target, mine]() mutable {
    if (mine > 0) target.copy_(padded_out.narrow(0, 0, mine));
  });
  return w;
}

WorkPtr GlooBackend::do_all_gather(at::Tensor& out, const at::Tensor& in, OpInfo info) {
  c10d::AllgatherOptions o;
  o.timeout = gloo_timeout(info);
  at::Tensor input = in;
  return std::make_shared<GlooWork>(std::move(info), pg_->_allgather_base(out, input, o));
}

WorkPtr GlooBackend::do_all_gather_v(at::Tensor& out, const at::Tensor& in,
                                     const std::vector<int64_t>& counts, OpInfo info) {
  int64_t max = *std::max_element(counts.begin(), counts.end());
  at::Tensor padded_in = at::zeros({max}, in.options());
  if (in.numel() > 0) padded_in.narrow(0, 0, in.numel()).copy_(in);
  at::Tensor padded_out = at::empty({static_cast<int64_t>(counts.size()) * max}, in.options());
  WorkPtr w = do_all_gather(padded_out, padded_in, std::move(info));
  at::Tensor target = out;
  w->then([padded_out, target, counts, max]() mutable {
    unpad_chunks(padded_out.view({static_cast<int64_t>(counts.size()), max}), counts, target);
  });
  return w;
}

WorkPtr GlooBackend::do_broadcast(at::Tensor& t, int root, OpInfo info) {
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = gloo_timeout(info);
  std::vector<at::Tensor> ts{t};
  return std::make_shared<GlooWork>(std::move(info), pg_->broadcast(ts, o));
}

WorkPtr GlooBackend::do_all_to_all_v(at::Tensor& out, const at::Tensor& in,
                                     const std::vector<int64_t>& send_counts,
                                     const std::vector<int64_t>& recv_counts, OpInfo info) {
  c10d::AllToAllOptions o;
  o.timeout = gloo_timeout(info);
  at::Tensor input = in;
  std::vector<int64_t> out_splits = recv_counts, in_splits = send_counts;
  return std::make_shared<GlooWork>(std::move(info),
                                    pg_->alltoall_base(out, input, out_splits, in_splits, o));
}

WorkPtr GlooBackend::do_send(const at::Tensor& t, int dst, int tag, OpInfo info) {
  std::vector<at::Tensor> ts{t};
  auto state = waiter()->add(pg_->send(ts, dst, tag), info.deadline);
  return std::make_shared<CompletionWork>(std::move(info), std::move(state));
}

WorkPtr GlooBackend::do_recv(at::Tensor& t, int src, int tag, OpInfo info) {
  std::vector<at::Tensor> ts{t};
  auto state = waiter()->add(pg_->recv(ts, src, tag), info.deadline);
  return std::make_shared<CompletionWork>(std::move(info), std::move(state));
}

WorkPtr GlooBackend::do_barrier(OpInfo info) {
  c10d::BarrierOptions o;
  o.timeout = gloo_timeout(info);
  return std::make_shared<GlooWork>(std::move(info), pg_->barrier(o));
}

std::shared_ptr<Backend> GlooBackend::do_split(int color, int key, const std::vector<int>& members,
                                               const std::string& group_id) {
  if (color < 0) return nullptr;
  int new_rank = 0;
  std::vector<int> global;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == group_rank()) new_rank = static_cast<int>(i);
    global.push_back(global_ranks()[members[i]]);
  }
  return create(store(), group_id, global, new_rank, default_timeout());
}

}  // namespace dtrain::comm
