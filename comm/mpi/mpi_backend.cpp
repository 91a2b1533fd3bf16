// The mpi backend; see mpi_backend.h.
#include "comm/mpi/mpi_backend.h"
#include "comm/detail/agreement.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "comm/detail/failing.h"
#include "comm/detail/job_store.h"
#include "comm/mpi/detail/comm_thread.h"
#include "core/error.h"
#include "core/fault_injection.h"
#include "core/log.h"

namespace dtrain::comm {

namespace {

// Set once an operation timed out: a communication thread may be stuck inside MPI, so MPI_Finalize must not
// run.
std::atomic<bool> g_mpi_failed{false};

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len);
}

void check_mpi(int code, const char* call) {
  if (code != MPI_SUCCESS) throw CommError(str_cat(call, " returned ", code, ": ", mpi_error_string(code)));
}

// Pairwise reduction of 16-bit floats in float32, as NCCL does; MPI has no bfloat16 or float16 type.
template <typename T, typename F>
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = T(F()(static_cast<float>(a[i]), static_cast<float>(b[i])));
}

struct Add {
  float operator()(float a, float b) const { return a + b; }
};
struct Max {
  float operator()(float a, float b) const { return std::isnan(a) || a > b ? a : b; }
};
struct Min {
  float operator()(float a, float b) const { return std::isnan(a) || a < b ? a : b; }
};

MPI_Datatype mpi_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kInt:
      return MPI_INT32_T;
    case at::kLong:
      return MPI_INT64_T;
    case at::kBFloat16:
    case at::kHalf:
      return MPI_UINT16_T;
    default:
      DTRAIN_ASSERT(false, "dtype ", t, " reached the mpi backend");
  }
  return MPI_DATATYPE_NULL;
}

int to_int(int64_t n, const char* op) {
  if (n > INT_MAX) {
    throw NotSupportedError(str_cat(rank_prefix(), " ", op, ": the mpi backend moves at most ", INT_MAX,
                                    " elements per rank in one call, got ", n, ". Split the tensor."));
  }
  return static_cast<int>(n);
}

std::vector<int> to_ints(const std::vector<int64_t>& v, const char* op) {
  std::vector<int> out;
  for (int64_t x : v) out.push_back(to_int(x, op));
  return out;
}

// Offsets of consecutive chunks; MPI takes them as int, so the total must fit too.
std::vector<int> displacements(const std::vector<int>& counts, const char* op) {
  std::vector<int> d(counts.size(), 0);
  int64_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    d[i] = static_cast<int>(total);
    total += counts[i];
  }
  to_int(total, op);
  return d;
}

// One queued MPI call and its outcome.
class MpiWork : public CompletionWork {
 public:
  MpiWork(OpInfo info, std::shared_ptr<detail::Task> task, std::shared_ptr<detail::CommThread> thread)
      : CompletionWork(std::move(info), std::move(task)), thread_(std::move(thread)) {}

 protected:
  void on_timed_out() override {
    thread_->abandon();   // its thread may stay blocked inside MPI
    g_mpi_failed = true;  // MPI_Finalize would hang
  }

 private:
  std::shared_ptr<detail::CommThread> thread_;
};

}  // namespace

// MPI itself, shared by every MpiBackend of the process: initialised once with MPI_THREAD_MULTIPLE (each
// group has its own communication thread), finalised when the last group goes, unless an operation timed out.
struct MpiBackend::Environment {
  bool we_initialised = false;
  MPI_Op ops16[2][3];  // [bf16, f16][sum, max, min]

  Environment() {
    int initialised = 0;
    MPI_Initialized(&initialised);
    int provided = 0;
    if (!initialised) {
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
      we_initialised = true;
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_MULTIPLE) {
      throw NotSupportedError(
          str_cat("mpi backend: MPI provides thread level ", provided,
                  " but dtrain needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE,
                  ") for its per-group communication threads. Use an MPI built with thread "
                  "support, and let dtrain initialise it or call MPI_Init_thread yourself."));
    }
    MPI_Op_create(&reduce16<c10::BFloat16, Add>, 1, &ops16[0][0]);
    MPI_Op_create(&reduce16<c10::BFloat16, Max>, 1, &ops16[0][1]);
    MPI_Op_create(&reduce16<c10::BFloat16, Min>, 1, &ops16[0][2]);
    MPI_Op_create(&reduce16<c10::Half, Add>, 1, &ops16[1][0]);
    MPI_Op_create(&reduce16<c10::Half, Max>, 1, &ops16[1][1]);
    MPI_Op_create(&reduce16<c10::Half, Min>, 1, &ops16[1][2]);
  }

  ~Environment() {
    // MPI_Finalize waits for every rank: not after a failure, nor while an exception leaves this rank (the
    // others may be waiting in a collective for it)
    if (g_mpi_failed || failing() || std::uncaught_exceptions() > 0) return;
    for (auto& row : ops16) {
      for (auto& op : row) MPI_Op_free(&op);
    }
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (we_initialised && !finalised) MPI_Finalize();
  }

  MPI_Op op(ReduceOp op, at::ScalarType t) const {
    int k = op == ReduceOp::kSum ? 0 : op == ReduceOp::kMax ? 1 : 2;
    if (t == at::kBFloat16) return ops16[0][k];
    if (t == at::kHalf) return ops16[1][k];
    return k == 0 ? MPI_SUM : k == 1 ? MPI_MAX : MPI_MIN;
  }

  // The process's Environment, created on first use and kept while any MpiBackend holds it.
  static std::shared_ptr<Environment> get() {
    static std::mutex mu;
    static std::weak_ptr<Environment> slot;
    std::lock_guard<std::mutex> lock(mu);
    if (auto env = slot.lock()) return env;
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (finalised) {
      throw NotSupportedError(
          "mpi backend: MPI was already finalised in this process and cannot be started again. Keep one mpi "
          "backend alive for the whole program.");
    }
    auto env = std::make_shared<Environment>();
    slot = env;
    return env;
  }
};

std::shared_ptr<MpiBackend> MpiBackend::create_world(std::chrono::milliseconds timeout,
                                                     const std::string& store_host) {
  std::shared_ptr<Environment> env = Environment::get();
  auto thread = detail::CommThread::start();
  // Results of calls on the communication thread live in a shared block: a call that times out may still
  // finish.
  struct Setup {
    MPI_Comm comm = MPI_COMM_NULL, p2p = MPI_COMM_NULL;
    int rank = 0, size = 1, port = 0, local_size = 0;
    char host[256] = {0};
    char secret[65] = {0};
  };
  auto setup = std::make_shared<Setup>();
  try {
    thread->run(
        [setup] {
          check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &setup->comm), "MPI_Comm_dup");
          MPI_Comm_set_errhandler(setup->comm, MPI_ERRORS_RETURN);
          check_mpi(MPI_Comm_dup(setup->comm, &setup->p2p), "MPI_Comm_dup");
          MPI_Comm_rank(setup->comm, &setup->rank);
          MPI_Comm_size(setup->comm, &setup->size);
          MPI_Comm local = MPI_COMM_NULL;
          check_mpi(MPI_Comm_split_type(setup->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local),
                    "MPI_Comm_split_type");
          MPI_Comm_size(local, &setup->local_size);
          MPI_Comm_free(&local);
        },
        timeout, "MPI_Comm_dup");

    // The progress store: rank 0 serves it on a free port (loopback only when every rank is on this host);
    // its host, port and a fresh job secret travel over MPI, and every rank joins as under gloo.
    JobStoreOptions so;
    so.rank = setup->rank;
    so.world_size = setup->size;
    so.timeout = timeout;
    so.loopback_only = setup->local_size == setup->size;
    if (setup->rank == 0) {
      so.listen_fd = listen_for_store(so.loopback_only, 0);
      setup->port = bound_port(so.listen_fd);
      if (so.loopback_only) {
        std::snprintf(setup->host, sizeof(setup->host), "127.0.0.1");
      } else if (!store_host.empty()) {
        std::snprintf(setup->host, sizeof(setup->host), "%s", store_host.c_str());
      } else {
        gethostname(setup->host, sizeof(setup->host) - 1);
      }
      std::snprintf(setup->secret, sizeof(setup->secret), "%s", random_secret().c_str());
    }
    thread->run(
        [setup] {
          check_mpi(MPI_Bcast(&setup->port, 1, MPI_INT, 0, setup->comm), "MPI_Bcast");
          check_mpi(MPI_Bcast(setup->host, sizeof(setup->host), MPI_CHAR, 0, setup->comm), "MPI_Bcast");
          check_mpi(MPI_Bcast(setup->secret, sizeof(setup->secret), MPI_CHAR, 0, setup->comm), "MPI_Bcast");
        },
        timeout, "sharing the store address (MPI_Bcast from rank 0)");
    so.host = setup->host;
    so.port = setup->port;
    so.secret = setup->secret;
    c10::intrusive_ptr<BoundedStore> store = open_job_store(so).store;
    fault_point("start", 0);
    std::vector<int> global(setup->size);
    for (int r = 0; r < setup->size; ++r) global[r] = r;
    return std::shared_ptr<MpiBackend>(
        new MpiBackend(env, thread, setup->comm, setup->p2p, "world", global, setup->rank, timeout, store));
  } catch (...) {
    if (thread->failed()) g_mpi_failed = true;
    thread->stop();
    throw;
  }
}

MpiBackend::MpiBackend(std::shared_ptr<Environment> env, std::shared_ptr<detail::CommThread> thread,
                       MPI_Comm comm, MPI_Comm p2p_comm, std::string group_id, std::vector<int> global_ranks,
                       int group_rank, std::chrono::milliseconds timeout,
                       c10::intrusive_ptr<BoundedStore> store)
    : Backend("mpi", std::move(group_id), std::move(global_ranks), group_rank, timeout, std::move(store)),
      env_(std::move(env)),
      thread_(std::move(thread)),
      comm_(comm),
      p2p_comm_(p2p_comm) {}

MpiBackend::~MpiBackend() {
  // In a failing process (comm/detail/failing.h), or one that an exception is leaving, nothing here may wait
  // for MPI: a peer that froze, died or waits for this rank holds MPI_Comm_free and MPI_Finalize without end,
  // so the threads are left and MPI is not finalised.
  bool failed = thread_->failed() || (p2p_thread_ && p2p_thread_->failed()) || failing() ||
                std::uncaught_exceptions() > 0;
  if (failed) {
    thread_->abandon();
    if (p2p_thread_) p2p_thread_->abandon();
  }
  if (p2p_thread_) p2p_thread_->stop();
  if (!failed) {
    MPI_Comm comm = comm_, p2p = p2p_comm_;
    try {
      thread_->run(
          [comm, p2p]() mutable {
            MPI_Comm_free(&p2p);
            MPI_Comm_free(&comm);
          },
          default_timeout(), "MPI_Comm_free");
    } catch (const std::exception&) {
      // Destructors do not throw; an unfreed communicator is left to MPI_Finalize.
    }
  }
  if (failed || thread_->failed()) g_mpi_failed = true;
  thread_->stop();
}

WorkPtr MpiBackend::submit(std::function<void()> call, OpInfo info) {
  // Once an agreement failed, the collectives queued behind it (an unsigned rest of a run among them) must
  // not reach MPI: they fail with that error instead.
  auto disagreed = disagreed_;
  if (info.signature[0] != 0) {
    // Agreement first, on the same thread and in the same task: the data call runs only if every rank passed
    // the same signature.
    auto sig = std::make_shared<OpInfo>(info);
    MPI_Comm comm = comm_;
    int n = group_size();
    std::vector<int> ranks = global_ranks();
    call = [call = std::move(call), sig, comm, n, ranks, disagreed] {
      if (*disagreed) std::rethrow_exception(*disagreed);
      std::vector<int64_t> all(static_cast<size_t>(n) * kSignatureFields);
      check_mpi(MPI_Allgather(sig->signature.data(), kSignatureFields, MPI_INT64_T, all.data(),
                              kSignatureFields, MPI_INT64_T, comm),
                "MPI_Allgather (agreement)");
      try {
        check_signatures(*sig, all.data(), ranks);
      } catch (...) {
        *disagreed = std::current_exception();
        throw;
      }
      call();
    };
  } else {
    call = [call = std::move(call), disagreed] {
      if (*disagreed) std::rethrow_exception(*disagreed);
      call();
    };
  }
  return std::make_shared<MpiWork>(std::move(info), thread_->enqueue(std::move(call)), thread_);
}

WorkPtr MpiBackend::submit_request(std::function<void(MPI_Request*)> start, std::vector<at::Tensor> keep,
                                   OpInfo info) {
  auto task = std::make_shared<detail::Task>();
  task->keep = std::move(keep);
  detail::Task* raw = task.get();  // the call runs while the queue holds the task
  task->call = [start, raw] { start(&raw->request); };
  if (!p2p_thread_) p2p_thread_ = detail::CommThread::start();
  return std::make_shared<MpiWork>(std::move(info), p2p_thread_->enqueue(std::move(task)), p2p_thread_);
}

WorkPtr MpiBackend::do_all_reduce(at::Tensor& t, ReduceOp op, OpInfo info) {
  int n = to_int(t.numel(), "all_reduce");
  MPI_Datatype type = mpi_type(t.scalar_type());
  MPI_Op mop = env_->op(op, t.scalar_type());
  MPI_Comm comm = comm_;
  return submit(
      [t, n, type, mop, comm] {
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), n, type, mop, comm), "MPI_Allreduce");
      },
      std::move(info));
}

WorkPtr MpiBackend::do_reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op, OpInfo info) {
  int n = to_int(out.numel(), "reduce_scatter");
  MPI_Datatype type = mpi_type(in.scalar_type());
  MPI_Op mop = env_->op(op, in.scalar_type());
  MPI_Comm comm = comm_;
  return submit(
      [out, in, n, type, mop, comm] {
        check_mpi(MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), n, type, mop, comm),
                  "MPI_Reduce_scatter_block");
      },
      std::move(info));
}

WorkPtr MpiBackend::do_reduce_scatter_v(at::Tensor& out, const at::Tensor& in,
                                        const std::vector<int64_t>& counts, ReduceOp op, OpInfo info) {
  std::vector<int> c = to_ints(counts, "reduce_scatter");
  MPI_Datatype type = mpi_type(in.scalar_type());
  MPI_Op mop = env_->op(op, in.scalar_type());
  MPI_Comm comm = comm_;
  return submit(
      [out, in, c, type, mop, comm] {
        check_mpi(MPI_Reduce_scatter(in.data_ptr(), out.data_ptr(), c.data(), type, mop, comm),
                  "MPI_Reduce_scatter");
      },
      std::move(info));
}

WorkPtr MpiBackend::do_all_gather(at::Tensor& out, const at::Tensor& in, OpInfo info) {
  int n = to_int(in.numel(), "all_gather");
  MPI_Datatype type = mpi_type(in.scalar_type());
  MPI_Comm comm = comm_;
  return submit(
      [out, in, n, type, comm] {
        check_mpi(MPI_Allgather(in.data_ptr(), n, type, out.data_ptr(), n, type, comm), "MPI_Allgather");
      },
      std::move(info));
}

WorkPtr MpiBackend::do_all_gather_v(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& counts,
                                    OpInfo info) {
  std::vector<int> c = to_ints(counts, "all_gather");
  std::vector<int> d = displacements(c, "all_gather");
  int mine = c[group_rank()];
  MPI_Datatype type = mpi_type(in.scalar_type());
  MPI_Comm comm = comm_;
  return submit(
      [out, in, c, d, mine, type, comm] {
        check_mpi(MPI_Allgatherv(in.data_ptr(), mine, type, out.data_ptr(), c.data(), d.data(), type, comm),
                  "MPI_Allgatherv");
      },
      std::move(info));
}

WorkPtr MpiBackend::do_broadcast(at::Tensor& t, int root, OpInfo info) {
  int n = to_int(t.numel(), "broadcast");
  MPI_Datatype type = mpi_type(t.scalar_type());
  MPI_Comm comm = comm_;
  return submit(
      [t, n, type, root, comm] { check_mpi(MPI_Bcast(t.data_ptr(), n, type, root, comm), "MPI_Bcast"); },
      std::move(info));
}

WorkPtr MpiBackend::do_all_to_all_v(at::Tensor& out, const at::Tensor& in,
                                    const std::vector<int64_t>& send_counts,
                                    const std::vector<int64_t>& recv_counts, OpInfo info) {
  std::vector<int> sc = to_ints(send_counts, "all_to_all"), rc = to_ints(recv_counts, "all_to_all");
  std::vector<int> sd = displacements(sc, "all_to_all"), rd = displacements(rc, "all_to_all");
  MPI_Datatype type = mpi_type(in.scalar_type());
  MPI_Comm comm = comm_;
  return submit(
      [out, in, sc, rc, sd, rd, type, comm] {
        check_mpi(MPI_Alltoallv(in.data_ptr(), sc.data(), sd.data(), type, out.data_ptr(), rc.data(),
                                rd.data(), type, comm),
                  "MPI_Alltoallv");
      },
      std::move(info));
}

// Point-to-point calls are non-blocking on the communication thread (which tests them while idle), so that a
// send and the matching recv issued back to back by two ranks cannot deadlock the serial thread of either.
WorkPtr MpiBackend::do_send(const at::Tensor& t, int dst, int tag, OpInfo info) {
  int n = to_int(t.numel(), "send");
  MPI_Datatype type = mpi_type(t.scalar_type());
  MPI_Comm comm = p2p_comm_;
  return submit_request(
      [t, n, type, dst, tag, comm](MPI_Request* request) {
        check_mpi(MPI_Isend(t.data_ptr(), n, type, dst, tag, comm, request), "MPI_Isend");
      },
      {t}, std::move(info));
}

WorkPtr MpiBackend::do_recv(at::Tensor& t, int src, int tag, OpInfo info) {
  int n = to_int(t.numel(), "recv");
  MPI_Datatype type = mpi_type(t.scalar_type());
  MPI_Comm comm = p2p_comm_;
  return submit_request(
      [t, n, type, src, tag, comm](MPI_Request* request) {
        check_mpi(MPI_Irecv(t.data_ptr(), n, type, src, tag, comm, request), "MPI_Irecv");
      },
      {t}, std::move(info));
}

WorkPtr MpiBackend::do_barrier(OpInfo info) {
  MPI_Comm comm = comm_;
  return submit([comm] { check_mpi(MPI_Barrier(comm), "MPI_Barrier"); }, std::move(info));
}

std::shared_ptr<Backend> MpiBackend::do_split(int color, int key, const std::vector<int>& members,
                                              const std::string& group_id) {
  // Keys are positions in `members`, which the caller already ordered by (key, rank).
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == group_rank()) new_rank = static_cast<int>(i);
  }
  // Shared: a split that times out may still finish after this frame is gone.
  auto sub = std::make_shared<std::pair<MPI_Comm, MPI_Comm>>(MPI_COMM_NULL, MPI_COMM_NULL);
  MPI_Comm comm = comm_;
  int mpi_color = color < 0 ? MPI_UNDEFINED : color;
  thread_->run(
      [sub, comm, mpi_color, new_rank] {
        check_mpi(MPI_Comm_split(comm, mpi_color, new_rank, &sub->first), "MPI_Comm_split");
        if (sub->first != MPI_COMM_NULL) {
          MPI_Comm_set_errhandler(sub->first, MPI_ERRORS_RETURN);
          check_mpi(MPI_Comm_dup(sub->first, &sub->second), "MPI_Comm_dup");
        }
      },
      default_timeout(), "MPI_Comm_split");
  if (color < 0) return nullptr;
  std::vector<int> global;
  for (int g : members) global.push_back(global_ranks()[g]);
  return std::shared_ptr<MpiBackend>(new MpiBackend(env_, detail::CommThread::start(), sub->first,
                                                    sub->second, group_id, global, new_rank,
                                                    default_timeout(), store()));
}

}  // namespace dtrain::comm
