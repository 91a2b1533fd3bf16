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
#include <thread>

#include "comm/completion.h"
#include "comm/failing.h"
#include "comm/job_store.h"
#include "comm/serial_thread.h"
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

// A collective's c10d Work, known at once or once the issuer thread started it.
struct Issued {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;                    // guarded by mu
  std::exception_ptr error;             // guarded by mu: the agreement failed, or starting it did
  c10::intrusive_ptr<c10d::Work> work;  // guarded by mu
};

class GlooWork : public Work {
 public:
  GlooWork(OpInfo info, c10::intrusive_ptr<c10d::Work> work)
      : Work(std::move(info)), work_(std::move(work)) {}
  GlooWork(OpInfo info, std::shared_ptr<Issued> issued) : Work(std::move(info)), issued_(std::move(issued)) {}

 protected:
  bool poll() override {
    if (!started(Clock::now())) return false;
    if (!work_->isCompleted()) return false;
    if (!work_->isSuccess()) std::rethrow_exception(work_->exception());
    return true;
  }

  bool wait_until(Clock::time_point deadline) override {
    if (!started(deadline)) return false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return poll();
    try {
      work_->wait(left);
    } catch (...) {
      // c10d reports its own timeout as an exception too ("Operation timed out!"): only a completed work
      // carries an engine error, and a work may complete between the timed wait giving up and this check,
      // so the caught exception is never what is reported (it was, rarely, a spurious failure of an op that
      // had succeeded at the end of a wait slice).
      if (!work_->isCompleted()) return false;
      if (work_->isSuccess()) return true;
      std::rethrow_exception(work_->exception());
    }
    return true;
  }

 private:
  // Whether the c10d Work exists (waiting for the issuer until `deadline`); rethrows the issuer's error.
  bool started(Clock::time_point deadline) {
    if (work_) return true;
    std::unique_lock<std::mutex> lock(issued_->mu);
    if (!issued_->cv.wait_until(lock, deadline, [&] { return issued_->done; })) return false;
    if (issued_->error) std::rethrow_exception(issued_->error);
    work_ = issued_->work;
    return true;
  }

  std::shared_ptr<Issued> issued_;
  c10::intrusive_ptr<c10d::Work> work_;
};

}  // namespace

// The order in which a group's signed collectives reach c10d (see GlooBackend::issue): `started` counts the
// collectives whose agreement is settled (the data op queued, or the error stored), in issue order.
struct GlooBackend::Sequencer {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t issued = 0;   // guarded by mu: collectives issued so far
  uint64_t started = 0;  // guarded by mu
  // guarded by mu: the first failed agreement; later collectives fail with it instead of reaching Gloo (the
  // unsigned rest of a run would meet mismatched sizes there)
  std::exception_ptr disagreed;
  uint64_t signed_count = 0;  // guarded by mu: signed collectives begun (their number on the shared board)

  void settle(uint64_t n) {
    {
      std::lock_guard<std::mutex> lock(mu);
      started = std::max(started, n);
    }
    cv.notify_all();
  }
};

namespace {

// A collective that is not handed to c10d because an earlier one of this process failed (comm/failing.h):
// a new engine op would wait for the failed peers up to a timeout of its own.
CommError not_started(const OpInfo& info) {
  return CommError(str_cat(describe(info),
                           ": not started, since an earlier collective of this process failed (this error "
                           "follows from that one, reported first)."));
}

void settle(Issued& issued, std::exception_ptr error, c10::intrusive_ptr<c10d::Work> work) {
  {
    std::lock_guard<std::mutex> lock(issued.mu);
    issued.done = true;
    issued.error = error;
    issued.work = std::move(work);
  }
  issued.cv.notify_all();
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
// come: it gives up at once. In a failing process (comm/failing.h), or one an exception is leaving, nothing
// here may wait for the engine:
// c10d's destructor would join worker threads still inside collectives with peers that froze or died, each
// until Gloo's own timeout, so the process group and the waiter thread are left to the process's exit.
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

// A signed collective: its signature is all-gathered (a c10d collective of its own), and when that completes,
// c10d's worker thread itself checks the signatures and queues the data op (the future's callback), so the
// data op starts without another thread hand-off. Every rank must queue its c10d collectives in the same
// order, so a collective (its all_gather, or an unsigned member of an AgreementRun itself) is queued only
// once every earlier collective of the group has settled (queued its data op or failed): at once when they
// have (the usual case: the caller waited for the previous one), else by the issuer thread, which waits for
// them; the caller never blocks. After a failed agreement, every later collective fails with that error.
// `start` and everything the agreement's callback holds refer to the process group by a plain pointer: the
// callback runs on the group's own worker thread, which the group joins before it is freed, and a strong
// reference released there would destroy the group on its own thread (join of itself: std::terminate).
WorkPtr GlooBackend::issue(OpInfo info, std::function<c10::intrusive_ptr<c10d::Work>()> start) {
  if (shm_) {
    // A killed peer's connections close during its exit, a moment before /proc shows it ended: looked at
    // again for up to 300 ms, on the error path only.
    info.dead_peers = [shm = shm_, ranks = global_ranks(), peers = info.peers] {
      const Clock::time_point until = Clock::now() + std::chrono::milliseconds(300);
      for (;;) {
        std::string dead;
        for (size_t g = 0; g < ranks.size(); ++g) {
          int pid = 0;
          if (std::find(peers.begin(), peers.end(), ranks[g]) == peers.end()) continue;
          if (shm->exited(static_cast<int>(g), &pid))
            dead += str_cat(dead.empty() ? "" : ", ", "rank ", ranks[g], " (pid ", pid, ")");
        }
        if (!dead.empty() || Clock::now() >= until) return dead;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling /proc, bounded above
      }
    };
    return issue_shm_agreement(std::move(info), std::move(start));
  }
  return issue_engine_agreement(std::move(info), std::move(start));
}

WorkPtr GlooBackend::issue_engine_agreement(OpInfo info,
                                            std::function<c10::intrusive_ptr<c10d::Work>()> start) {
  auto issued = std::make_shared<Issued>();
  std::shared_ptr<Sequencer> seq = sequencer_;
  const bool signed_op = info.signature[0] != 0;
  uint64_t n;
  bool now;
  {
    std::lock_guard<std::mutex> lock(seq->mu);
    if (seq->disagreed) std::rethrow_exception(seq->disagreed);
    if (failing()) throw not_started(info);
    n = ++seq->issued;
    now = seq->started == n - 1 && issuer_pending_ == 0;
    if (!signed_op && now) {
      seq->started = n;  // queued below, before any later collective can be
    } else if (!now) {
      ++issuer_pending_;
    }
  }
  // An unsigned collective (the rest of an AgreementRun) goes to c10d at once when nothing is pending, else
  // in order behind the collectives before it.
  if (!signed_op && now) return std::make_shared<GlooWork>(std::move(info), start());
  auto begin = [pg = pg_.get(), info, start = std::move(start), issued, seq, n, signed_op,
                ranks = global_ranks()] {
    try {
      {
        std::lock_guard<std::mutex> lock(seq->mu);
        if (seq->disagreed) std::rethrow_exception(seq->disagreed);
      }
      if (failing()) throw not_started(info);
      if (!signed_op) {
        settle(*issued, nullptr, start());
        seq->settle(n);
        return;
      }
      const int size = static_cast<int>(ranks.size());
      at::Tensor mine = at::empty({kSignatureFields}, at::kLong);
      std::copy(info.signature.begin(), info.signature.end(), mine.data_ptr<int64_t>());
      at::Tensor all = at::empty({size * kSignatureFields}, at::kLong);
      c10d::AllgatherOptions o;
      o.timeout = info.timeout + kGlooGrace;
      auto agreement = pg->_allgather_base(all, mine, o);
      agreement->getFuture()->addCallback([info, start, issued, seq, n, ranks, all](c10::ivalue::Future& f) {
        std::exception_ptr error;
        c10::intrusive_ptr<c10d::Work> work;
        try {
          if (f.hasError()) std::rethrow_exception(f.exception_ptr());
          try {
            check_signatures(info, all.data_ptr<int64_t>(), ranks);
          } catch (...) {
            std::lock_guard<std::mutex> lock(seq->mu);
            if (!seq->disagreed) seq->disagreed = std::current_exception();
            throw;
          }
          if (failing()) throw not_started(info);
          work = start();
        } catch (...) {
          error = std::current_exception();
        }
        settle(*issued, error, std::move(work));
        seq->settle(n);
      });
    } catch (...) {
      settle(*issued, std::current_exception(), {});
      seq->settle(n);
    }
  };
  if (now) {
    begin();
  } else {
    if (!issuer_) issuer_ = std::make_unique<SerialThread>();
    Clock::time_point deadline = info.deadline;
    issuer_->post([this, seq, n, deadline, begin = std::move(begin), closing = closing_]() mutable {
      {
        // Past the op's deadline the group is failing anyway: queue it rather than wait without end.
        std::unique_lock<std::mutex> lock(seq->mu);
        seq->cv.wait_until(lock, deadline, [&] { return seq->started >= n - 1 || closing->load(); });
        --issuer_pending_;
      }
      begin();
    });
  }
  return std::make_shared<GlooWork>(std::move(info), std::move(issued));
}

namespace {

// How long a signed collective's caller waits for the other ranks' signatures on the shared board before the
// issuer thread takes the wait over (the caller never blocks longer): ranks that issue a collective together
// meet well within it, and the data op then starts from the caller's thread, as an unchecked one would.
constexpr auto kCallerAgreementWait = std::chrono::milliseconds(2);

}  // namespace

// A signed collective with the shared board (ShmAgreement): the signature is published there and, once every
// rank's is, checked and the data op queued, in the same order on every rank as in issue_engine_agreement.
// When every earlier collective has settled and the others publish within kCallerAgreementWait, all of this
// runs on the caller's thread; otherwise the issuer thread does it, waiting up to the op's deadline.
WorkPtr GlooBackend::issue_shm_agreement(OpInfo info, std::function<c10::intrusive_ptr<c10d::Work>()> start) {
  auto issued = std::make_shared<Issued>();
  std::shared_ptr<Sequencer> seq = sequencer_;
  const bool signed_op = info.signature[0] != 0;
  uint64_t n;
  bool now;
  {
    std::lock_guard<std::mutex> lock(seq->mu);
    if (seq->disagreed) std::rethrow_exception(seq->disagreed);
    if (failing()) throw not_started(info);
    n = ++seq->issued;
    now = seq->started == n - 1 && issuer_pending_ == 0;
    if (!signed_op && now) {
      seq->started = n;  // queued below, before any later collective can be
    } else if (!now) {
      ++issuer_pending_;
    }
  }
  if (!signed_op && now) return std::make_shared<GlooWork>(std::move(info), start());
  ShmAgreement* shm = shm_.get();
  // Checks the gathered signatures and queues the data op; settles `issued` either way.
  auto conclude = [info, start, issued, seq, ranks = global_ranks()](const std::vector<int64_t>& all) {
    std::exception_ptr error;
    c10::intrusive_ptr<c10d::Work> work;
    try {
      const size_t k = kSignatureFields;
      bool same = true;
      for (size_t g = 1; g < ranks.size() && same; ++g) {
        same = std::equal(all.begin(), all.begin() + k, all.begin() + g * k);
      }
      if (!same) {
        try {
          check_signatures(info, all.data(), ranks);
        } catch (...) {
          std::lock_guard<std::mutex> lock(seq->mu);
          if (!seq->disagreed) seq->disagreed = std::current_exception();
          throw;
        }
      }
      if (failing()) throw not_started(info);
      work = start();
    } catch (...) {
      error = std::current_exception();
    }
    settle(*issued, error, std::move(work));
  };
  // Waits on the shared board up to the op's deadline (and Gloo's grace) on the issuer thread.
  const size_t fields = static_cast<size_t>(group_size()) * kSignatureFields;
  auto finish_late = [shm, info, issued, conclude, fields, closing = closing_,
                      ranks = global_ranks()](uint64_t s) {
    std::vector<int64_t> all(fields);
    if (shm->gather(s, all.data(), info.deadline + kGlooGrace, closing.get())) {
      conclude(all);
      return;
    }
    std::string who, dead;
    for (int g : shm->missing(s)) {
      who += str_cat(who.empty() ? "" : ", ", g);
      int pid = 0;
      if (shm->exited(g, &pid))
        dead += str_cat(dead.empty() ? "" : ", ", "rank ", ranks[g], " (pid ", pid, ")");
    }
    if (!dead.empty()) {
      std::string progress;  // what the others published (bounded; the store's host may be the one gone)
      try {
        if (info.diagnose) progress = info.diagnose();
      } catch (const std::exception& e) {
        progress = str_cat("(the peers' progress could not be read: ", e.what(), ")");
      }
      settle(*issued,
             std::make_exception_ptr(CommError(str_cat(
                 describe(info), ": ", dead,
                 " exited without entering it: its process is dead, not late (it died while this rank waited "
                 "for it: killed, crashed or returned early; its own output and exit status say which).",
                 progress.empty() ? "" : " ", progress))),
             {});
      return;
    }
    settle(
        *issued,
        std::make_exception_ptr(CommError(str_cat(
            describe(info),
            closing->load() ? ": the group was destroyed while waiting for group ranks [" : ": group ranks [",
            who,
            closing->load() ? "] to enter it" : "] never entered it (agreement through shared memory)"))),
        {});
  };
  if (now) {
    uint64_t s;
    {
      std::lock_guard<std::mutex> lock(seq->mu);
      s = ++seq->signed_count;
    }
    shm->publish(s, info.signature.data());
    std::vector<int64_t> all(fields);
    if (shm->gather(s, all.data(), std::min(info.deadline, Clock::now() + kCallerAgreementWait))) {
      conclude(all);
      seq->settle(n);
    } else {
      // The op stays unsettled for the sequencer until the issuer concludes it: later ones queue behind it.
      {
        std::lock_guard<std::mutex> lock(seq->mu);
        ++issuer_pending_;
      }
      if (!issuer_) issuer_ = std::make_unique<SerialThread>();
      issuer_->post([this, seq, n, s, finish_late] {
        finish_late(s);
        {
          std::lock_guard<std::mutex> lock(seq->mu);
          --issuer_pending_;
        }
        seq->settle(n);
      });
    }
    return std::make_shared<GlooWork>(std::move(info), std::move(issued));
  }
  if (!issuer_) issuer_ = std::make_unique<SerialThread>();
  Clock::time_point deadline = info.deadline;
  issuer_->post([this, seq, n, deadline, signed_op, shm, start, issued, finish_late, info,
                 closing = closing_]() mutable {
    {
      std::unique_lock<std::mutex> lock(seq->mu);
      seq->cv.wait_until(lock, deadline, [&] { return seq->started >= n - 1 || closing->load(); });
      --issuer_pending_;
    }
    try {
      {
        std::lock_guard<std::mutex> lock(seq->mu);
        if (seq->disagreed) std::rethrow_exception(seq->disagreed);
      }
      if (failing()) throw not_started(info);
      if (!signed_op) {
        settle(*issued, nullptr, start());
      } else {
        uint64_t s;
        {
          std::lock_guard<std::mutex> lock(seq->mu);
          s = ++seq->signed_count;
        }
        shm->publish(s, info.signature.data());
        finish_late(s);
      }
    } catch (...) {
      settle(*issued, std::current_exception(), {});
    }
    seq->settle(n);
  });
  return std::make_shared<GlooWork>(std::move(info), std::move(issued));
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

WorkPtr GlooBackend::do_all_gather(at::Tensor& out, const at::Tensor& in, OpInfo info) {
  c10d::AllgatherOptions o;
  o.timeout = gloo_timeout(info);
  return issue(std::move(info),
               [pg = pg_.get(), out, input = in, o]() mutable { return pg->_allgather_base(out, input, o); });
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
