// Backend's public half: argument checks, sequence numbers, staging of non-contiguous tensors, avg, split.
#include "comm/backend.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <thread>

#include "comm/comm_log.h"
#include "comm/detail/agreement.h"
#include "comm/detail/bounded_store.h"
#include "comm/detail/failure_board.h"
#include "comm/detail/progress_board.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/log.h"

namespace dtrain::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

bool is_supported_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kBFloat16:
    case at::kHalf:
    case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

namespace {

int64_t sum_of(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

// FNV-1a over the counts: equal on every rank exactly when the counts are (up to collisions).
int64_t hash_of(const std::vector<int64_t>& v) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t x : v) {
    for (int b = 0; b < 8; ++b) {
      h ^= static_cast<uint64_t>(x >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return static_cast<int64_t>(h >> 1);
}

int64_t op_of(ReduceOp op) { return static_cast<int64_t>(op); }

// A read-only input as a flat contiguous tensor (a copy only when the input is not contiguous).
at::Tensor flat_input(const at::Tensor& t) { return t.contiguous().view({-1}); }

// An output written by the engine: a flat contiguous buffer, and a step that copies it back into `t` when `t`
// itself could not be used (non-contiguous). `read_first` copies t's values in (in-place ops).
at::Tensor flat_output(at::Tensor& t, bool read_first, std::function<void()>* copy_back) {
  if (t.is_contiguous()) return t.view({-1});
  at::Tensor buf = read_first ? t.contiguous().view({-1}) : at::empty({t.numel()}, t.options());
  at::Tensor target = t;
  *copy_back = [target, buf]() mutable { target.copy_(buf.view(target.sizes())); };
  return buf;
}

}  // namespace

Backend::~Backend() = default;

Backend::Backend(std::string name, std::string group_id, std::vector<int> global_ranks, int group_rank,
                 std::chrono::milliseconds default_timeout, c10::intrusive_ptr<BoundedStore> store)
    : name_(std::move(name)),
      group_id_(std::move(group_id)),
      global_ranks_(std::move(global_ranks)),
      group_rank_(group_rank),
      default_timeout_(default_timeout),
      store_(std::move(store)) {
  DTRAIN_ASSERT(group_rank_ >= 0 && group_rank_ < group_size(), "group_rank ", group_rank_, " size ",
                group_size());
  board_ = std::make_shared<ProgressBoard>(store_, group_id_, global_ranks_, group_rank_);
  failures_ = std::make_shared<FailureBoard>(store_, global_rank());
}

void Backend::report_failure(const std::string& tag, const std::string& message) {
  failures_->post(tag, message);
}

std::vector<int> Backend::all_peers() const {
  std::vector<int> peers;
  for (int g = 0; g < group_size(); ++g) {
    if (g != group_rank_) peers.push_back(global_ranks_[g]);
  }
  return peers;
}

OpInfo Backend::begin(const char* op, std::vector<int> peers, const Timeout& timeout, bool collective) {
  OpInfo info;
  info.op = op;
  info.backend = name_;
  info.group = group_id_;
  info.peers = std::move(peers);
  info.timeout = timeout.value_or(default_timeout_);
  if (info.timeout.count() <= 0) {
    throw ValueError(
        str_cat(rank_prefix(), " ", op, ": timeout ", info.timeout.count(),
                " ms is not positive. Pass a positive timeout or leave it unset for the default (",
                default_timeout_.count(), " ms)."));
  }
  info.issued = Clock::now();
  info.deadline = info.issued + info.timeout;
  std::shared_ptr<FailureBoard> failures = failures_;
  info.abort_reason = [failures] { return failures->foreign_failure(); };
  if (collective) {
    info.seq = ++collective_seq_;
    board_->enter(info.seq, op);
    if (group_id_ == "world") fault_point("collective", static_cast<int64_t>(info.seq));
    std::shared_ptr<ProgressBoard> board = board_;
    uint64_t seq = info.seq;
    std::vector<int> waited = info.peers;
    std::string op_name = op;
    Clock::time_point issued = info.issued;
    info.diagnose = [board, seq, waited, op_name, issued] {
      // An op that fails at once (a peer's connections closed) must not trust entries its peers may not have
      // published yet, or ranks that did enter are reported as behind: until a second after the op was
      // issued, a diagnosis that names anyone is read again each publish interval, and the last one stands.
      const auto settled = issued + std::chrono::milliseconds(1000);
      std::string d = board->diagnose(seq, waited, op_name);
      while (!d.empty() && Clock::now() < settled) {
        std::this_thread::sleep_for(ProgressBoard::kPublishInterval);
        d = board->diagnose(seq, waited, op_name);
      }
      return d;
    };
  } else {
    info.seq = ++p2p_seq_;
  }
  return info;
}

void Backend::check_tensor(const char* op, const char* what, const at::Tensor& t) const {
  if (!t.defined()) {
    throw ValueError(
        str_cat(rank_prefix(), " ", op, ": ", what, " is an undefined tensor. Pass an allocated tensor."));
  }
  if (!t.device().is_cpu()) {
    throw NotSupportedError(str_cat(rank_prefix(), " ", op, ": the ", name_,
                                    " backend handles CPU tensors, but ", what, " is on ", t.device().str(),
                                    ". Move it to the CPU or use the nccl backend."));
  }
  if (!is_supported_dtype(t.scalar_type())) {
    throw NotSupportedError(
        str_cat(rank_prefix(), " ", op, ": ", what, " has dtype ", t.scalar_type(),
                "; supported are float32, float64, bfloat16, float16, int32, int64. Cast it first."));
  }
}

void Backend::check_counts(const char* op, const char* what, const std::vector<int64_t>& counts) const {
  if (static_cast<int>(counts.size()) != group_size()) {
    throw ValueError(str_cat(rank_prefix(), " ", op, ": ", what, " has ", counts.size(),
                             " entries but the group has ", group_size(),
                             " ranks. Pass one count per rank."));
  }
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] < 0) {
      throw ValueError(str_cat(rank_prefix(), " ", op, ": ", what, "[", g, "] = ", counts[g],
                               " is negative. Counts are element counts, 0 or more."));
    }
  }
}

void Backend::check_peer(const char* op, const char* what, int peer) const {
  if (peer < 0 || peer >= group_size() || peer == group_rank_) {
    throw ValueError(str_cat(rank_prefix(), " ", op, ": ", what, " ", peer,
                             " is not another rank of this group (0..", group_size() - 1, ", this rank is ",
                             group_rank_, "). Pass a group rank other than ", group_rank_, "."));
  }
}

namespace {

void check_same_dtype(const char* op, const at::Tensor& output, const at::Tensor& input) {
  if (output.scalar_type() != input.scalar_type()) {
    throw ValueError(str_cat(rank_prefix(), " ", op, ": output dtype ", output.scalar_type(),
                             " differs from input dtype ", input.scalar_type(),
                             ". Allocate the output with the input's dtype."));
  }
}

void check_numel(const char* op, const char* what, int64_t actual, int64_t expected, const std::string& why) {
  if (actual != expected) {
    throw ValueError(str_cat(rank_prefix(), " ", op, ": ", what, " has ", actual, " elements but needs ",
                             expected, " (", why, "). Resize it."));
  }
}

// Finishes a Work built from staged buffers: avg division, then copy-back.
WorkPtr finish(WorkPtr work, std::function<void()> copy_back, at::Tensor avg_buffer, int divisor) {
  if (avg_buffer.defined()) work->then([avg_buffer, divisor]() mutable { avg_buffer.div_(divisor); });
  if (copy_back) work->then(std::move(copy_back));
  return work;
}

// Communication accounting, the one place it is recorded (comm/comm_log.h): a collective issued while a
// CommCause is alive on this thread goes into the log once its Work was waited for.
WorkPtr accounted(WorkPtr work, StepKind kind, const at::Tensor& contributed, int group_size) {
  if (!CommCause::active()) return work;
  const int64_t bytes = contributed.numel() * contributed.element_size();
  CommRecord r{CommCause::current(),
               kind,
               CommCause::axis(),
               bytes,
               CommCause::predicted().value_or(predicted_collective_seconds(kind, bytes, group_size)),
               0};
  const Clock::time_point issued = work->info().issued;
  work->then([r = std::move(r), issued]() mutable {
    r.measured_s = std::chrono::duration<double>(Clock::now() - issued).count();
    CommLog::instance().record(std::move(r));
  });
  return work;
}

}  // namespace

WorkPtr Backend::all_reduce(at::Tensor& tensor, const AllReduceOptions& opts) {
  check_tensor("all_reduce", "tensor", tensor);
  if (opts.op == ReduceOp::kAvg && !at::isFloatingType(tensor.scalar_type())) {
    throw ValueError(str_cat(rank_prefix(), " all_reduce: avg on ", tensor.scalar_type(),
                             " would truncate. Use sum and divide, or cast to a floating dtype."));
  }
  OpInfo info = begin("all_reduce", all_peers(), opts.timeout, true);
  sign_in_run(&info, opts.run, 1, tensor, tensor.numel(), 0, op_of(opts.op), -1);
  std::function<void()> copy_back;
  at::Tensor buf = flat_output(tensor, true, &copy_back);
  ReduceOp op = opts.op == ReduceOp::kAvg ? ReduceOp::kSum : opts.op;
  WorkPtr w = buf.numel() == 0 || group_size() == 1 ? std::make_shared<CompletedWork>(info)
                                                    : do_all_reduce(buf, op, info);
  bool divide = opts.op == ReduceOp::kAvg && group_size() > 1;
  return accounted(finish(w, copy_back, divide ? buf : at::Tensor(), group_size()), StepKind::kAllReduce,
                   tensor, group_size());
}

WorkPtr Backend::reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                const ReduceScatterOptions& opts) {
  // The equal-size form is reduce_scatter_v with equal counts, which checks everything else.
  check_tensor("reduce_scatter", "output", output);
  check_tensor("reduce_scatter", "input", input);
  check_numel("reduce_scatter", "input", input.numel(), output.numel() * group_size(),
              str_cat("group_size ", group_size(), " x output ", output.numel()));
  std::vector<int64_t> counts(group_size(), output.numel());
  return reduce_scatter_v(output, input, counts, opts);
}

WorkPtr Backend::reduce_scatter_v(at::Tensor& output, const at::Tensor& input,
                                  const std::vector<int64_t>& counts, const ReduceScatterOptions& opts) {
  const char* op_name = "reduce_scatter";
  check_tensor(op_name, "output", output);
  check_tensor(op_name, "input", input);
  check_same_dtype(op_name, output, input);
  check_counts(op_name, "counts", counts);
  check_numel(op_name, "input", input.numel(), sum_of(counts), "the sum of counts");
  check_numel(op_name, "output", output.numel(), counts[group_rank_], str_cat("counts[", group_rank_, "]"));
  if (opts.op == ReduceOp::kAvg && !at::isFloatingType(output.scalar_type())) {
    throw ValueError(str_cat(rank_prefix(), " reduce_scatter: avg on ", output.scalar_type(),
                             " would truncate. Use sum and divide, or cast to a floating dtype."));
  }
  OpInfo info = begin(op_name, all_peers(), opts.timeout, true);
  sign_in_run(&info, opts.run, 2, input, sum_of(counts), hash_of(counts), op_of(opts.op), -1);
  at::Tensor in = flat_input(input);
  std::function<void()> copy_back;
  at::Tensor out = flat_output(output, false, &copy_back);
  ReduceOp op = opts.op == ReduceOp::kAvg ? ReduceOp::kSum : opts.op;
  bool equal = std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
  WorkPtr w;
  if (sum_of(counts) == 0) {
    w = std::make_shared<CompletedWork>(info);
  } else if (group_size() == 1) {
    out.copy_(in);
    w = std::make_shared<CompletedWork>(info);
  } else if (opts.input_is_scratch) {
    w = do_reduce_scatter_scratch(out, in, counts, op, info);
  } else if (equal) {
    w = do_reduce_scatter(out, in, op, info);
  } else {
    w = do_reduce_scatter_v(out, in, counts, op, info);
  }
  bool divide = opts.op == ReduceOp::kAvg && group_size() > 1;
  return accounted(finish(w, copy_back, divide ? out : at::Tensor(), group_size()), StepKind::kReduceScatter,
                   input, group_size());
}

WorkPtr Backend::do_reduce_scatter_scratch(at::Tensor& output, at::Tensor& input,
                                           const std::vector<int64_t>& counts, ReduceOp op, OpInfo info) {
  bool equal = std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
  if (equal) return do_reduce_scatter(output, input, op, std::move(info));
  return do_reduce_scatter_v(output, input, counts, op, std::move(info));
}

WorkPtr Backend::all_gather(at::Tensor& output, const at::Tensor& input, const AllGatherOptions& opts) {
  // The equal-size form is all_gather_v with equal counts, which checks everything else.
  check_tensor("all_gather", "output", output);
  check_tensor("all_gather", "input", input);
  check_numel("all_gather", "output", output.numel(), input.numel() * group_size(),
              str_cat("group_size ", group_size(), " x input ", input.numel()));
  std::vector<int64_t> counts(group_size(), input.numel());
  return all_gather_v(output, input, counts, opts);
}

WorkPtr Backend::all_gather_v(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& counts,
                              const AllGatherOptions& opts) {
  const char* op_name = "all_gather";
  check_tensor(op_name, "output", output);
  check_tensor(op_name, "input", input);
  check_same_dtype(op_name, output, input);
  check_counts(op_name, "counts", counts);
  check_numel(op_name, "input", input.numel(), counts[group_rank_], str_cat("counts[", group_rank_, "]"));
  check_numel(op_name, "output", output.numel(), sum_of(counts), "the sum of counts");
  OpInfo info = begin(op_name, all_peers(), opts.timeout, true);
  sign_in_run(&info, opts.run, 3, input, sum_of(counts), hash_of(counts), -1, -1);
  at::Tensor in = flat_input(input);
  std::function<void()> copy_back;
  at::Tensor out = flat_output(output, false, &copy_back);
  bool equal = std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; });
  WorkPtr w;
  if (sum_of(counts) == 0) {
    w = std::make_shared<CompletedWork>(info);
  } else if (group_size() == 1) {
    out.copy_(in);
    w = std::make_shared<CompletedWork>(info);
  } else if (equal) {
    w = do_all_gather(out, in, info);
  } else {
    w = do_all_gather_v(out, in, counts, info);
  }
  return accounted(finish(w, copy_back, at::Tensor(), 1), StepKind::kAllGather, input, group_size());
}

WorkPtr Backend::broadcast(at::Tensor& tensor, const BroadcastOptions& opts) {
  check_tensor("broadcast", "tensor", tensor);
  if (opts.root < 0 || opts.root >= group_size()) {
    throw ValueError(str_cat(rank_prefix(), " broadcast: root ", opts.root, " is outside the group (0..",
                             group_size() - 1, "). Pass a group rank as root."));
  }
  OpInfo info = begin("broadcast", all_peers(), opts.timeout, true);
  sign(&info, 4, tensor, tensor.numel(), 0, -1, opts.root);
  std::function<void()> copy_back;
  at::Tensor buf = flat_output(tensor, group_rank_ == opts.root, &copy_back);
  WorkPtr w = buf.numel() == 0 || group_size() == 1 ? std::make_shared<CompletedWork>(info)
                                                    : do_broadcast(buf, opts.root, info);
  return finish(w, copy_back, at::Tensor(), 1);
}

WorkPtr Backend::all_to_all(at::Tensor& output, const at::Tensor& input, const AllToAllOptions& opts) {
  check_tensor("all_to_all", "output", output);
  check_tensor("all_to_all", "input", input);
  if (input.numel() % group_size() != 0) {
    throw ValueError(str_cat(rank_prefix(), " all_to_all: input has ", input.numel(),
                             " elements, not divisible by group_size ", group_size(),
                             ". Use all_to_all_v for uneven chunks."));
  }
  std::vector<int64_t> counts(group_size(), input.numel() / group_size());
  return all_to_all_v(output, input, counts, counts, opts);
}

WorkPtr Backend::all_to_all_v(at::Tensor& output, const at::Tensor& input,
                              const std::vector<int64_t>& send_counts,
                              const std::vector<int64_t>& recv_counts, const AllToAllOptions& opts) {
  const char* op_name = "all_to_all";
  check_tensor(op_name, "output", output);
  check_tensor(op_name, "input", input);
  check_same_dtype(op_name, output, input);
  check_counts(op_name, "send_counts", send_counts);
  check_counts(op_name, "recv_counts", recv_counts);
  check_numel(op_name, "input", input.numel(), sum_of(send_counts), "the sum of send_counts");
  check_numel(op_name, "output", output.numel(), sum_of(recv_counts), "the sum of recv_counts");
  OpInfo info = begin(op_name, all_peers(), opts.timeout, true);
  // The counts legitimately differ per rank; only the collective and the dtype must agree.
  sign(&info, 5, input, 0, 0, -1, -1);
  at::Tensor in = flat_input(input);
  std::function<void()> copy_back;
  at::Tensor out = flat_output(output, false, &copy_back);
  WorkPtr w;
  if (group_size() == 1) {
    out.copy_(in);
    w = std::make_shared<CompletedWork>(info);
  } else {
    w = do_all_to_all_v(out, in, send_counts, recv_counts, info);
  }
  return accounted(finish(w, copy_back, at::Tensor(), 1), StepKind::kAllToAll, input, group_size());
}

WorkPtr Backend::send(const at::Tensor& tensor, int dst, const SendOptions& opts) {
  check_tensor("send", "tensor", tensor);
  check_peer("send", "dst", dst);
  OpInfo info = begin("send", {global_ranks_[dst]}, opts.timeout, false);
  return do_send(flat_input(tensor), dst, opts.tag, info);
}

WorkPtr Backend::recv(at::Tensor& tensor, int src, const RecvOptions& opts) {
  check_tensor("recv", "tensor", tensor);
  check_peer("recv", "src", src);
  OpInfo info = begin("recv", {global_ranks_[src]}, opts.timeout, false);
  std::function<void()> copy_back;
  at::Tensor buf = flat_output(tensor, false, &copy_back);
  return finish(do_recv(buf, src, opts.tag, info), copy_back, at::Tensor(), 1);
}

WorkPtr Backend::barrier(const BarrierOptions& opts) {
  OpInfo info = begin("barrier", all_peers(), opts.timeout, true);
  if (group_size() == 1) return std::make_shared<CompletedWork>(info);
  sign(&info, 6, at::Tensor(), 0, 0, -1, -1);
  return do_barrier(info);
}

std::shared_ptr<Backend> Backend::split(int color, int key) {
  at::Tensor mine = at::empty({2}, at::kLong);
  mine[0] = static_cast<int64_t>(color);
  mine[1] = static_cast<int64_t>(key);
  at::Tensor all = at::empty({2 * group_size()}, at::kLong);
  all_gather(all, mine)->wait();
  auto a = all.accessor<int64_t, 1>();
  std::vector<std::pair<int64_t, int>> order;  // (key, group rank) of the ranks that share this color
  if (color >= 0) {
    for (int g = 0; g < group_size(); ++g) {
      if (a[2 * g] == color) order.emplace_back(a[2 * g + 1], g);
    }
    std::sort(order.begin(), order.end());
  }
  std::vector<int> members;
  for (auto& [k, g] : order) members.push_back(g);
  std::string id = str_cat(group_id_, ".", splits_++, ".c", color);
  return do_split(color, key, members, id);
}

}  // namespace dtrain::comm
