// The mpi backend; see mpi_backend.h.
#include "comm/mpi/mpi_backend.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <climits>
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

class MpiWork : public Work {
 public:
  MpiWork(OpInfo info, MPI_Request request, std::vector<at::Tensor> keep, std::function<void()> on_failure)
      : Work(std::move(info)),
        request_(request),
        keep_(std::move(keep)),
        on_failure_(std::move(on_failure)) {}

 protected:
  bool poll() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int flag = 0;
    MPI_Status status;
    int rc = MPI_Test(&request_, &flag, &status);
    if (rc != MPI_SUCCESS) {
      on_failure_();
      check_mpi(rc, "MPI_Test");
    }
    if (flag) keep_.clear();
    return flag != 0;
  }

  bool wait_until(Clock::time_point deadline) override {
    // Spin with yields first (small collectives finish in tens of microseconds), then back off so that
    // waiting ranks leave the cores to the ranks still computing (4 ranks on 2 cores).
    auto start = Clock::now();
    while (!poll()) {
      auto now = Clock::now();
      if (now >= deadline) {
        on_failure_();
        return false;
      }
      if (now - start < std::chrono::milliseconds(2)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    return true;
  }

 private:
  MPI_Request request_;
  std::vector<at::Tensor> keep_;
  std::function<void()> on_failure_;
};

}  // namespace

// MPI itself, shared by the world group and every sub-group: initialised once, finalised when the last group
// goes, unless an operation failed (a pending collective would make MPI_Finalize hang; the launcher ends the
// job instead).
struct MpiBackend::Environment {
  bool we_initialised = false;
  bool failed = false;
  MPI_Op ops16[2][3];  // [bf16, f16][sum, max, min]

  Environment() {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      we_initialised = true;
    }
    MPI_Op_create(&reduce16<c10::BFloat16, Add>, 1, &ops16[0][0]);
    MPI_Op_create(&reduce16<c10::BFloat16, Max>, 1, &ops16[0][1]);
    MPI_Op_create(&reduce16<c10::BFloat16, Min>, 1, &ops16[0][2]);
    MPI_Op_create(&reduce16<c10::Half, Add>, 1, &ops16[1][0]);
    MPI_Op_create(&reduce16<c10::Half, Max>, 1, &ops16[1][1]);
    MPI_Op_create(&reduce16<c10::Half, Min>, 1, &ops16[1][2]);
  }

  ~Environment() {
    if (failed) return;
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
};

std::shared_ptr<MpiBackend> MpiBackend::create_world(std::chrono::milliseconds timeout,
                                                     const std::string& store_host) {
  auto env = std::make_shared<Environment>();
  MPI_Comm comm;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);

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
  check_mpi(MPI_Bcast(&port, 1, MPI_INT, 0, comm), "MPI_Bcast");
  check_mpi(MPI_Bcast(host, sizeof(host), MPI_CHAR, 0, comm), "MPI_Bcast");
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
  if (!env_->failed) MPI_Comm_free(&comm_);
}

WorkPtr MpiBackend::make_work(MPI_Request request, std::vector<at::Tensor> keep, OpInfo info) {
  std::shared_ptr<Environment> env = env_;
  return std::make_shared<MpiWork>(std::move(info), request, std::move(keep), [env] { env->failed = true; });
}

WorkPtr MpiBackend::do_all_reduce(at::Tensor& t, ReduceOp op, OpInfo info) {
  MPI_Request req;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), to_int(t.numel(), "all_reduce"),
                           mpi_type(t.scalar_type()), env_->op(op, t.scalar_type()), comm_, &req),
            "MPI_Iallreduce");
  return make_work(req, {t}, std::move(info));
}

WorkPtr MpiBackend::do_reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op, OpInfo info) {
  MPI_Request req;
  check_mpi(
      MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), to_int(out.numel(), "reduce_scatter"),
                                mpi_type(in.scalar_type()), env_->op(op, in.scalar_type()), comm_, &req),
      "MPI_Ireduce_scatter_block");
  return make_work(req, {out, in}, std::move(info));
}

WorkPtr MpiBackend::do_reduce_scatter_v(at::Tensor& out, const at::Tensor& in,
                                        const std::vector<int64_t>& counts, ReduceOp op, OpInfo info) {
  auto c = std::make_shared<std::vector<int>>(to_ints(counts, "reduce_scatter"));
  MPI_Request req;
  check_mpi(MPI_Ireduce_scatter(in.data_ptr(), out.data_ptr(), c->data(), mpi_type(in.scalar_type()),
                                env_->op(op, in.scalar_type()), comm_, &req),
            "MPI_Ireduce_scatter");
  auto w = make_work(req, {out, in}, std::move(info));
  w->then([c] {});  // the counts array must live until the request completes
  return w;
}

WorkPtr MpiBackend::do_all_gather(at::Tensor& out, const at::Tensor& in, OpInfo info) {
  MPI_Request req;
  MPI_Datatype type = mpi_type(in.scalar_type());
  int n = to_int(in.numel(), "all_gather");
  check_mpi(MPI_Iallgather(in.data_ptr(), n, type, out.data_ptr(), n, type, comm_, &req), "MPI_Iallgather");
  return make_work(req, {out, in}, std::move(info));
}

WorkPtr MpiBackend::do_all_gather_v(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& counts,
                                    OpInfo info) {
  auto c = std::make_shared<std::vector<int>>(to_ints(counts, "all_gather"));
  auto d = std::make_shared<std::vector<int>>(displacements(*c));
  MPI_Datatype type = mpi_type(in.scalar_type());
  MPI_Request req;
  check_mpi(MPI_Iallgatherv(in.data_ptr(), (*c)[group_rank()], type, out.data_ptr(), c->data(), d->data(),
                            type, comm_, &req),
            "MPI_Iallgatherv");
  auto w = make_work(req, {out, in}, std::move(info));
  w->then([c, d] {});
  return w;
}

WorkPtr MpiBackend::do_broadcast(at::Tensor& t, int root, OpInfo info) {
  MPI_Request req;
  check_mpi(
      MPI_Ibcast(t.data_ptr(), to_int(t.numel(), "broadcast"), mpi_type(t.scalar_type()), root, comm_, &req),
      "MPI_Ibcast");
  return make_work(req, {t}, std::move(info));
}

WorkPtr MpiBackend::do_all_to_all_v(at::Tensor& out, const at::Tensor& in,
                                    const std::vector<int64_t>& send_counts,
                                    const std::vector<int64_t>& recv_counts, OpInfo info) {
  auto sc = std::make_shared<std::vector<int>>(to_ints(send_counts, "all_to_all"));
  auto rc = std::make_shared<std::vector<int>>(to_ints(recv_counts, "all_to_all"));
  auto sd = std::make_shared<std::vector<int>>(displacements(*sc));
  auto rd = std::make_shared<std::vector<int>>(displacements(*rc));
  MPI_Datatype type = mpi_type(in.scalar_type());
  MPI_Request req;
  check_mpi(MPI_Ialltoallv(in.data_ptr(), sc->data(), sd->data(), type, out.data_ptr(), rc->data(),
                           rd->data(), type, comm_, &req),
            "MPI_Ialltoallv");
  auto w = make_work(req, {out, in}, std::move(info));
  w->then([sc, rc, sd, rd] {});
  return w;
}

WorkPtr MpiBackend::do_send(const at::Tensor& t, int dst, int tag, OpInfo info) {
  MPI_Request req;
  check_mpi(
      MPI_Isend(t.data_ptr(), to_int(t.numel(), "send"), mpi_type(t.scalar_type()), dst, tag, comm_, &req),
      "MPI_Isend");
  return make_work(req, {t}, std::move(info));
}

WorkPtr MpiBackend::do_recv(at::Tensor& t, int src, int tag, OpInfo info) {
  MPI_Request req;
  check_mpi(
      MPI_Irecv(t.data_ptr(), to_int(t.numel(), "recv"), mpi_type(t.scalar_type()), src, tag, comm_, &req),
      "MPI_Irecv");
  return make_work(req, {t}, std::move(info));
}

WorkPtr MpiBackend::do_barrier(OpInfo info) {
  MPI_Request req;
  check_mpi(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
  return make_work(req, {}, std::move(info));
}

std::shared_ptr<Backend> MpiBackend::do_split(int color, int key, const std::vector<int>& members,
                                              const std::string& group_id) {
  // Keys are positions in `members`, which the caller already ordered by (key, rank).
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == group_rank()) new_rank = static_cast<int>(i);
  }
  MPI_Comm sub;
  check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, new_rank, &sub), "MPI_Comm_split");
  if (color < 0) return nullptr;
  MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  std::vector<int> global;
  for (int g : members) global.push_back(global_ranks()[g]);
  return std::shared_ptr<MpiBackend>(
      new MpiBackend(env_, sub, group_id, global, new_rank, default_timeout(), store()));
}

}  // namespace dtrain::comm
