// The mpi backend; see mpi_backend.h.
#include "comm/mpi/mpi_backend.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace dtrain::comm {

namespace {

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

std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

// One queued MPI call and its outcome.
struct Task {
  std::function<void()> call;
  // Non-blocking calls (MPI_Isend, MPI_Irecv) leave their request here; the task completes when it does.
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<at::Tensor> keep;  // the buffers of a pending request
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;         // guarded by mu
  std::exception_ptr error;  // guarded by mu
};

class MpiWork : public Work {
 public:
  MpiWork(OpInfo info, std::shared_ptr<Task> task, std::function<void()> on_timeout)
      : Work(std::move(info)), task_(std::move(task)), on_timeout_(std::move(on_timeout)) {}

 protected:
  bool poll() override {
    std::lock_guard<std::mutex> lock(task_->mu);
    if (task_->error) std::rethrow_exception(task_->error);
    return task_->done;
  }

  bool wait_until(Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(task_->mu);
    if (!task_->cv.wait_until(lock, deadline, [&] { return task_->done; })) {
      on_timeout_();
      return false;
    }
    if (task_->error) std::rethrow_exception(task_->error);
    return true;
  }

 private:
  std::shared_ptr<Task> task_;
  std::function<void()> on_timeout_;
};

}  // namespace

// MPI itself, shared by the world group and every sub-group: initialised once, finalised when the last group
// goes, unless an operation failed (a pending collective would make MPI_Finalize hang; the launcher ends the
// job instead).
struct MpiBackend::Environment {
  bool we_initialised = false;
  std::atomic<bool> failed{false};
  MPI_Op ops16[2][3];  // [bf16, f16][sum, max, min]

  Environment() {
    int initialised = 0;
    MPI_Initialized(&initialised);
    int provided = 0;
    if (!initialised) {
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      we_initialised = true;
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
      throw NotSupportedError(str_cat("mpi backend: MPI provides thread level ", provided,
                                      " but dtrain needs MPI_THREAD_SERIALIZED (", MPI_THREAD_SERIALIZED,
                                      ") for its communication thread. Initialise MPI with MPI_Init_thread("
                                      "MPI_THREAD_SERIALIZED) or let dtrain initialise it."));
    }
    MPI_Op_create(&reduce16<c10::BFloat16, Add>, 1, &ops16[0][0]);
    MPI_Op_create(&reduce16<c10::BFloat16, Max>, 1, &ops16[0][1]);
    MPI_Op_create(&reduce16<c10::BFloat16, Min>, 1, &ops16[0][2]);
    MPI_Op_create(&reduce16<c10::Half, Add>, 1, &ops16[1][0]);
    MPI_Op_create(&reduce16<c10::Half, Max>, 1, &ops16[1][1]);
    MPI_Op_create(&reduce16<c10::Half, Min>, 1, &ops16[1][2]);
    worker_ = std::thread([this] { work_loop(); });
  }

  ~Environment() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (failed) {
      // The thread may be blocked in a collective that will never complete; MPI_Finalize would hang too.
      worker_.detach();
      return;
    }
    worker_.join();
    for (auto& row : ops16) {
      for (auto& op : row) MPI_Op_free(&op);
    }
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (we_initialised && !finalised) MPI_Finalize();
  }

  MPI_Op op(ReduceOp op, at::ScalarType t) {
    int k = op == ReduceOp::kSum ? 0 : op == ReduceOp::kMax ? 1 : 2;
    if (t == at::kBFloat16) return ops16[0][k];
    if (t == at::kHalf) return ops16[1][k];
    return k == 0 ? MPI_SUM : k == 1 ? MPI_MAX : MPI_MIN;
  }

  // Queues an MPI call; calls run one at a time, in order, on the communication thread.
  std::shared_ptr<Task> submit(std::function<void()> call) {
    auto task = std::make_shared<Task>();
    task->call = std::move(call);
    return enqueue(std::move(task));
  }

  std::shared_ptr<Task> enqueue(std::shared_ptr<Task> task) {
    if (failed) {
      throw CommError(str_cat(rank_prefix(),
                              " mpi backend: an earlier operation failed or timed out, so MPI is in ",
                              "an unknown state. Exit this process; the launcher stops the job."));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(task);
    }
    cv_.notify_one();
    return task;
  }

  // Runs an MPI call on the communication thread and waits for it (at most `timeout`).
  void run(std::function<void()> call, std::chrono::milliseconds timeout, const char* what) {
    auto task = submit(std::move(call));
    std::unique_lock<std::mutex> lock(task->mu);
    if (!task->cv.wait_for(lock, timeout, [&] { return task->done; })) {
      failed = true;
      throw TimeoutError(str_cat(rank_prefix(), " mpi backend: ", what, " did not finish within ",
                                 timeout.count(), " ms. Check that every rank reaches it."));
    }
    if (task->error) std::rethrow_exception(task->error);
  }

 private:
  // Runs queued calls in order. While requests of non-blocking calls are pending and nothing is queued, tests
  // them every few microseconds; a blocking collective progresses them too, inside MPI.
  void work_loop() {
    std::vector<std::shared_ptr<Task>> pending;
    for (;;) {
      std::shared_ptr<Task> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (pending.empty()) {
          cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        } else {
          cv_.wait_for(lock, std::chrono::microseconds(20), [&] { return stop_ || !queue_.empty(); });
        }
        if (stop_ && queue_.empty() && pending.empty()) return;
        if (!queue_.empty()) {
          task = std::move(queue_.front());
          queue_.pop_front();
        }
      }
      if (task) {
        std::exception_ptr error;
        try {
          task->call();
        } catch (...) {
          error = std::current_exception();
        }
        task->call = nullptr;  // release the tensors it held (a pending request's task keeps them in `keep`)
        if (!error && task->request != MPI_REQUEST_NULL) {
          pending.push_back(std::move(task));
        } else {
          finish(*task, error);
        }
      }
      for (size_t i = 0; i < pending.size();) {
        int flag = 0;
        int rc = MPI_Test(&pending[i]->request, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || flag) {
          std::exception_ptr error;
          if (rc != MPI_SUCCESS) {
            error = std::make_exception_ptr(
                CommError(str_cat("MPI_Test returned ", rc, ": ", mpi_error_string(rc))));
          }
          finish(*pending[i], error);
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
    }
  }

  static void finish(Task& task, std::exception_ptr error) {
    task.keep.clear();
    {
      std::lock_guard<std::mutex> lock(task.mu);
      task.done = true;
      task.error = error;
    }
    task.cv.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> queue_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::thread worker_;
};

std::shared_ptr<MpiBackend> MpiBackend::create_world(std::chrono::milliseconds timeout,
                                                     const std::string& store_host) {
  // One Environment (and so one communication thread) per process, shared by every MpiBackend alive.
  static std::mutex env_mu;
  static std::weak_ptr<Environment> env_slot;
  std::shared_ptr<Environment> env;
  {
    std::lock_guard<std::mutex> lock(env_mu);
    env = env_slot.lock();
    if (!env) {
      int finalised = 0;
      MPI_Finalized(&finalised);
      if (finalised) {
        throw NotSupportedError(
            "mpi backend: MPI was already finalised in this process and cannot be started again. Keep one "
            "mpi "
            "backend alive for the whole program.");
      }
      env = std::make_shared<Environment>();
      env_slot = env;
    }
  }
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  env->run(
      [&] {
        check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
        MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
        MPI_Comm_rank(comm, &rank);
        MPI_Comm_size(comm, &size);
      },
      timeout, "MPI_Comm_dup");

  // The progress store: rank 0 serves it on a free port; its host and port travel over MPI.
  c10d::TCPStoreOptions so;
  so.numWorkers = size;
  so.waitWorkers = false;
  so.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  char host[256] = {0};
  int port = 0;
  if (rank == 0) {
    so.isServer = true;
    so.port = 0;
    auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
    port = server->getPort();
    if (!store_host.empty()) {
      std::snprintf(host, sizeof(host), "%s", store_host.c_str());
    } else {
      gethostname(host, sizeof(host) - 1);
    }
    store = server;
  }
  env->run(
      [&] {
        check_mpi(MPI_Bcast(&port, 1, MPI_INT, 0, comm), "MPI_Bcast");
        check_mpi(MPI_Bcast(host, sizeof(host), MPI_CHAR, 0, comm), "MPI_Bcast");
      },
      timeout, "sharing the store address (MPI_Bcast from rank 0)");
  if (rank != 0) {
    so.isServer = false;
    so.port = static_cast<uint16_t>(port);
    store = c10::make_intrusive<c10d::TCPStore>(std::string(host), so);
  }
  std::vector<int> global(size);
  for (int r = 0; r < size; ++r) global[r] = r;
  return std::shared_ptr<MpiBackend>(new MpiBackend(env, comm, "world", global, rank, timeout, store));
}

MpiBackend::MpiBackend(std::shared_ptr<Environment> env, MPI_Comm comm, std::string group_id,
                       std::vector<int> global_ranks, int group_rank, std::chrono::milliseconds timeout,
                       c10::intrusive_ptr<c10d::Store> store)
    : Backend("mpi", std::move(group_id), std::move(global_ranks), group_rank, timeout, std::move(store)),
      env_(std::move(env)),
      comm_(comm) {}

MpiBackend::~MpiBackend() {
  if (env_->failed) return;
  MPI_Comm comm = comm_;
  try {
    env_->run([comm]() mutable { MPI_Comm_free(&comm); }, default_timeout(), "MPI_Comm_free");
  } catch (const std::exception&) {
    // Destructors do not throw; a failed free leaves the communicator to MPI_Finalize.
  }
}

WorkPtr MpiBackend::submit(std::function<void()> call, OpInfo info) {
  std::shared_ptr<Environment> env = env_;
  return std::make_shared<MpiWork>(std::move(info), env_->submit(std::move(call)),
                                   [env] { env->failed = true; });
}

WorkPtr MpiBackend::submit_request(std::function<void(MPI_Request*)> start, std::vector<at::Tensor> keep,
                                   OpInfo info) {
  std::shared_ptr<Environment> env = env_;
  auto task = std::make_shared<Task>();
  task->keep = std::move(keep);
  Task* raw = task.get();  // the call runs while the queue holds the task
  task->call = [start, raw] { start(&raw->request); };
  return std::make_shared<MpiWork>(std::move(info), env_->enqueue(std::move(task)),
                                   [env] { env->failed = true; });
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
  std::vector<int> d = displacements(c);
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
  std::vector<int> sd = displacements(sc), rd = displacements(rc);
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
  MPI_Comm comm = comm_;
  return submit_request(
      [t, n, type, dst, tag, comm](MPI_Request* request) {
        check_mpi(MPI_Isend(t.data_ptr(), n, type, dst, tag, comm, request), "MPI_Isend");
      },
      {t}, std::move(info));
}

WorkPtr MpiBackend::do_recv(at::Tensor& t, int src, int tag, OpInfo info) {
  int n = to_int(t.numel(), "recv");
  MPI_Datatype type = mpi_type(t.scalar_type());
  MPI_Comm comm = comm_;
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
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm comm = comm_;
  env_->run(
      [&] {
        check_mpi(MPI_Comm_split(comm, color < 0 ? MPI_UNDEFINED : color, new_rank, &sub), "MPI_Comm_split");
        if (sub != MPI_COMM_NULL) MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
      },
      default_timeout(), "MPI_Comm_split");
  if (color < 0) return nullptr;
  std::vector<int> global;
  for (int g : members) global.push_back(global_ranks()[g]);
  return std::shared_ptr<MpiBackend>(
      new MpiBackend(env_, sub, group_id, global, new_rank, default_timeout(), store()));
}

}  // namespace dtrain::comm
