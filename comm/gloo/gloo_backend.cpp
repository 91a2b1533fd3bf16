// The gloo backend; see gloo_backend.h.
#include "comm/gloo/gloo_backend.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>

#include "comm/detail/completion.h"
#include "comm/detail/failing.h"
#include "comm/detail/job_store.h"
#include "comm/detail/serial_thread.h"
#include "comm/gloo/detail/gloo_work.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

namespace dtrain::comm {

using namespace gloo_detail;

namespace {

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

}  // namespace

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

// Copies `counts`-sized chunks of `flat` into rows of a [k, max] buffer, for the padded reduce-scatter.
at::Tensor pad_chunks(const at::Tensor& flat, const std::vector<int64_t>& counts, int64_t max) {
  at::Tensor padded = at::zeros({static_cast<int64_t>(counts.size()), max}, flat.options());
  int64_t off = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] > 0) padded[g].narrow(0, 0, counts[g]).copy_(flat.narrow(0, off, counts[g]));
    off += counts[g];
  }
  return padded;
}

}  // namespace

std::string loopback_advertise_problem(const EnvMap& env, const std::string& hostname) {
  if (auto ifname = env_get(env, "GLOO_SOCKET_IFNAME"); ifname && !ifname->empty()) return "";
  if (single_host_job(env)) return "";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(hostname.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return "";
  bool all_loopback = true;
  std::string first;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    char text[NI_MAXHOST] = {0};
    ::getnameinfo(ai->ai_addr, ai->ai_addrlen, text, sizeof(text), nullptr, 0, NI_NUMERICHOST);
    if (first.empty()) first = text;
    std::string a = text;
    if (!(a.rfind("127.", 0) == 0 || a == "::1")) all_loopback = false;
  }
  ::freeaddrinfo(res);
  if (!all_loopback) return "";
  std::string interfaces;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      char text[NI_MAXHOST] = {0};
      ::getnameinfo(i->ifa_addr, sizeof(sockaddr_in), text, sizeof(text), nullptr, 0, NI_NUMERICHOST);
      if (std::string(text).rfind("127.", 0) == 0) continue;
      interfaces += str_cat(interfaces.empty() ? "" : ", ", i->ifa_name, " (", text, ")");
    }
    ::freeifaddrs(ifs);
  }
  return str_cat(rank_prefix(), " gloo: this job spans several hosts (LOCAL_WORLD_SIZE ",
                 env_get(env, "LOCAL_WORLD_SIZE").value_or("unset"), " of WORLD_SIZE ",
                 env_get(env, "WORLD_SIZE").value_or("unset"), ", MASTER_ADDR ",
                 env_get(env, "MASTER_ADDR").value_or("unset"), ") but this host's name '", hostname,
                 "' resolves to ", first,
                 ", a loopback address: Gloo would advertise it and the other hosts could not connect. Set "
                 "GLOO_SOCKET_IFNAME to the interface that reaches them",
                 interfaces.empty() ? "" : str_cat(" (this host has: ", interfaces, ")"),
                 ", or fix the name's entry in /etc/hosts.");
}

namespace {

// The shared-memory agreement board of a group whose ranks all share this host: group rank 0 creates it and
// broadcasts its name; every rank maps it, and one all_reduce (min) tells all whether every rank could.
// nullptr (Gloo's all_gather then carries the check) when one could not (another host, another IPC
// namespace), for a one-rank group, or when DTRAIN_GLOO_AGREEMENT=engine asks for the all_gather.
std::unique_ptr<ShmAgreement> local_agreement(c10d::ProcessGroupGloo& pg, const std::string& group_id,
                                              int rank, int size, std::chrono::milliseconds timeout) {
  const std::string mode = env_get(current_env(), "DTRAIN_GLOO_AGREEMENT").value_or("auto");
  if (mode != "auto" && mode != "engine") {
    throw ValueError(
        str_cat("DTRAIN_GLOO_AGREEMENT='", mode,
                "' is not a mode: use auto (shared memory when every rank of a group shares this "
                "host, else Gloo's all_gather) or engine (always Gloo's all_gather)."));
  }
  if (size < 2 || mode == "engine") return nullptr;
  constexpr int64_t kNameBytes = 56;
  at::Tensor msg = at::zeros({kNameBytes + 8}, at::kByte);
  std::unique_ptr<ShmAgreement> shm;
  std::string why;
  if (rank == 0) {
    shm = ShmAgreement::create(size, &why);
    if (shm && static_cast<int64_t>(shm->name().size()) < kNameBytes) {
      std::memcpy(msg.data_ptr<uint8_t>(), shm->name().data(), shm->name().size());
      const uint64_t nonce = shm->nonce();
      std::memcpy(msg.data_ptr<uint8_t>() + kNameBytes, &nonce, 8);
    } else {
      shm.reset();
    }
  }
  c10d::BroadcastOptions bo;
  bo.rootRank = 0;
  bo.timeout = timeout;
  std::vector<at::Tensor> m{msg};
  pg.broadcast(m, bo)->wait(timeout);
  if (rank != 0 && msg.data_ptr<uint8_t>()[0] != 0) {
    std::string name(reinterpret_cast<const char*>(msg.data_ptr<uint8_t>()));
    uint64_t nonce = 0;
    std::memcpy(&nonce, msg.data_ptr<uint8_t>() + kNameBytes, 8);
    shm = ShmAgreement::open(name, nonce, rank, size, &why);
  } else if (rank != 0) {
    why = "group rank 0 could not create it";
  }
  at::Tensor ok = at::full({1}, shm ? 1 : 0, at::kInt);
  c10d::AllreduceOptions ao;
  ao.reduceOp = c10d::ReduceOp::MIN;
  ao.timeout = timeout;
  std::vector<at::Tensor> o{ok};
  pg.allreduce(o, ao)->wait(timeout);
  if (ok.item<int>() == 0) {
    log_debug(rank_prefix(), " gloo: group ", group_id, " checks agreement through Gloo's all_gather",
              why.empty() ? std::string(" (another rank could not map the shared board)")
                          : str_cat(" (", why, ")"));
    return nullptr;
  }
  shm->unlink();
  log_debug(rank_prefix(), " gloo: group ", group_id, " checks agreement through shared memory");
  return shm;
}

}  // namespace

std::shared_ptr<GlooBackend> GlooBackend::create(c10::intrusive_ptr<BoundedStore> store, std::string group_id,
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
  // Gloo's full-mesh connect retries past its own timeout; the whole construction is bounded by ours.
  auto holder = std::make_shared<c10::intrusive_ptr<c10d::ProcessGroupGloo>>();
  const std::string hint =
      "Check that every rank started, and on several hosts that GLOO_SOCKET_IFNAME names an interface the "
      "other hosts can reach.";
  try {
    run_bounded(
        str_cat("gloo: connecting group ", group_id, " (", size, " ranks)"), StoreClock::now() + timeout,
        [holder, prefixed, group_rank, size, opts] {
          *holder = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, group_rank, size, opts);
        },
        hint);
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw CommError(str_cat(rank_prefix(), " gloo: connecting group ", group_id, " (", size,
                            " ranks) failed: ", e.what_without_backtrace(), " ", hint));
  } catch (const std::exception& e) {
    throw CommError(str_cat(rank_prefix(), " gloo: connecting group ", group_id, " (", size,
                            " ranks) failed: ", e.what(), " ", hint));
  }
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg = *holder;
  std::unique_ptr<ShmAgreement> shm;
  try {
    shm = local_agreement(*pg, group_id, group_rank, size, timeout);
  } catch (const c10::Error& e) {
    throw CommError(str_cat(rank_prefix(), " gloo: setting up group ", group_id,
                            "'s agreement check failed: ", e.what_without_backtrace(), " ", hint));
  }
  return std::shared_ptr<GlooBackend>(new GlooBackend(pg, std::move(store), std::move(group_id),
                                                      std::move(global_ranks), group_rank, timeout,
                                                      std::move(shm)));
}

GlooBackend::GlooBackend(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg,
                         c10::intrusive_ptr<BoundedStore> store, std::string group_id,
                         std::vector<int> global_ranks, int group_rank, std::chrono::milliseconds timeout,
                         std::unique_ptr<ShmAgreement> shm)
    : Backend("gloo", std::move(group_id), std::move(global_ranks), group_rank, timeout, std::move(store)),
      pg_(std::move(pg)),
      sequencer_(std::make_shared<Sequencer>()),
      shm_(std::move(shm)) {}

// The issuer thread may be waiting on the shared board, or for an earlier collective, for ranks that will not
// come: it gives up at once. In a failing process (comm/detail/failing.h), or one an exception is leaving,
// nothing here may wait for the engine: c10d's destructor would join worker threads still inside collectives
// with peers that froze or died, each until Gloo's own timeout, so the process group and the waiter thread
// are left to the process's exit.
GlooBackend::~GlooBackend() {
  closing_->store(true);
  // (the mutex taken once: an issuer task between its predicate check and its sleep cannot miss the notify)
  { std::lock_guard<std::mutex> lock(sequencer_->mu); }
  sequencer_->cv.notify_all();
  if (failing() || std::uncaught_exceptions() > 0) {
    issuer_.reset();  // its queued collectives settle at once (failing: none reaches c10d)
    (void)waiter_.release();
    (void)pg_.release();
  }
}

// c10d's send/recv Works: their isCompleted() only turns true inside wait(), and a timed wait() on them that
// expires closes every connection of the group, so a caller's short wait must never reach them. The waiter
// thread waits on each once, in issue order, up to the op's own deadline, and the caller waits on the waiter.
std::shared_ptr<Completion> GlooBackend::wait_in_order(c10::intrusive_ptr<c10d::Work> work,
                                                       Clock::time_point deadline) {
  if (!waiter_) waiter_ = std::make_unique<SerialThread>();
  auto state = std::make_shared<Completion>();
  waiter_->post([work, deadline, state] {
    std::exception_ptr error;
    try {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      work->wait(std::max(left, std::chrono::milliseconds(1)) + kGlooGrace);
    } catch (...) {
      error = std::current_exception();
    }
    state->finish(error);
  });
  return state;
}

namespace {
std::chrono::milliseconds gloo_timeout(const OpInfo& info) { return info.timeout + kGlooGrace; }
}  // namespace

WorkPtr GlooBackend::do_all_reduce(at::Tensor& t, ReduceOp op, OpInfo info) {
  c10d::AllreduceOptions o;
  o.reduceOp = c10d_op(op);
  o.timeout = gloo_timeout(info);
  return issue(std::move(info), [pg = pg_.get(), t, o]() mutable {
    std::vector<at::Tensor> ts{t};
    return pg->allreduce(ts, o);
  });
}

WorkPtr GlooBackend::do_reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op, OpInfo info) {
  c10d::ReduceScatterOptions o;
  o.reduceOp = c10d_op(op);
  o.timeout = gloo_timeout(info);
  return issue(std::move(info), [pg = pg_.get(), out, input = in, o]() mutable {
    return pg->_reduce_scatter_base(out, input, o);
  });
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

// An all-reduce in the caller's input, then this rank's chunk copied out: no temporary at all, where
// do_reduce_scatter_v pads a copy of the input and c10d's reduce-scatter clones it again before all-reducing.
WorkPtr GlooBackend::do_reduce_scatter_scratch(at::Tensor& out, at::Tensor& in,
                                               const std::vector<int64_t>& counts, ReduceOp op, OpInfo info) {
  int64_t start = std::accumulate(counts.begin(), counts.begin() + group_rank(), int64_t{0});
  int64_t mine = counts[group_rank()];
  WorkPtr w = do_all_reduce(in, op, std::move(info));
  at::Tensor target = out;
  at::Tensor reduced = in;
  w->then([target, reduced, start, mine]() mutable {
    if (mine > 0) target.copy_(reduced.narrow(0, start, mine));
  });
  return w;
}

WorkPtr GlooBackend::do_all_gather(at::Tensor& out, const at::Tensor& in, OpInfo info) {
  std::vector<int64_t> counts(group_size(), in.numel());
  return do_all_gather_v(out, in, counts, std::move(info));
}

// One broadcast per rank, each rooted at its rank and in place in that rank's chunk of the output: no
// temporary, where c10d's all-gather holds a flat copy of the whole output while in flight (and the uneven
// form would pad both sides besides). The broadcasts run on the process group's threads side by side.
WorkPtr GlooBackend::do_all_gather_v(at::Tensor& out, const at::Tensor& in,
                                     const std::vector<int64_t>& counts, OpInfo info) {
  std::vector<int64_t> starts(counts.size(), 0);
  for (size_t g = 1; g < counts.size(); ++g) starts[g] = starts[g - 1] + counts[g - 1];
  const int me = group_rank();
  at::Tensor own = out.narrow(0, starts[me], counts[me]);
  if (counts[me] > 0 && own.data_ptr() != in.data_ptr()) own.copy_(in.view({-1}));
  c10d::BroadcastOptions o;
  o.timeout = gloo_timeout(info);
  return issue(std::move(info), [pg = pg_.get(), out, counts, starts, o]() mutable {
    std::vector<c10::intrusive_ptr<c10d::Work>> parts;
    for (size_t g = 0; g < counts.size(); ++g) {
      if (counts[g] == 0) continue;
      std::vector<at::Tensor> chunk{out.narrow(0, starts[g], counts[g])};
      o.rootRank = static_cast<int>(g);
      parts.push_back(pg->broadcast(chunk, o));
    }
    return c10::intrusive_ptr<c10d::Work>(c10::make_intrusive<AllOfWork>(std::move(parts)));
  });
}

WorkPtr GlooBackend::do_broadcast(at::Tensor& t, int root, OpInfo info) {
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = gloo_timeout(info);
  return issue(std::move(info), [pg = pg_.get(), t, o]() mutable {
    std::vector<at::Tensor> ts{t};
    return pg->broadcast(ts, o);
  });
}

WorkPtr GlooBackend::do_all_to_all_v(at::Tensor& out, const at::Tensor& in,
                                     const std::vector<int64_t>& send_counts,
                                     const std::vector<int64_t>& recv_counts, OpInfo info) {
  c10d::AllToAllOptions o;
  o.timeout = gloo_timeout(info);
  std::vector<int64_t> out_splits = recv_counts, in_splits = send_counts;
  return issue(std::move(info), [pg = pg_.get(), out, input = in, out_splits, in_splits, o]() mutable {
    return pg->alltoall_base(out, input, out_splits, in_splits, o);
  });
}

WorkPtr GlooBackend::do_send(const at::Tensor& t, int dst, int tag, OpInfo info) {
  std::vector<at::Tensor> ts{t};
  auto state = wait_in_order(pg_->send(ts, dst, tag), info.deadline);
  return std::make_shared<CompletionWork>(std::move(info), std::move(state));
}

WorkPtr GlooBackend::do_recv(at::Tensor& t, int src, int tag, OpInfo info) {
  std::vector<at::Tensor> ts{t};
  auto state = wait_in_order(pg_->recv(ts, src, tag), info.deadline);
  return std::make_shared<CompletionWork>(std::move(info), std::move(state));
}

WorkPtr GlooBackend::do_barrier(OpInfo info) {
  c10d::BarrierOptions o;
  o.timeout = gloo_timeout(info);
  return issue(std::move(info), [pg = pg_.get(), o]() mutable { return pg->barrier(o); });
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
