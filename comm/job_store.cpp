// The job's store and admission; see job_store.h.
#include "comm/detail/job_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/secure_random.h"

namespace dtrain::comm {

namespace {

const char* const kChallenge = "dtrain/join/challenge";
const char* const kTickets = "dtrain/join/tickets";
const char* const kReadRefusals = "dtrain/join/refusals-read";  // claimants that read an abort verdict
std::string claim_key(int64_t t) { return str_cat("dtrain/join/claim/", t); }
std::string verdict_key(int64_t t) { return str_cat("dtrain/join/verdict/", t); }

std::string hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

std::string hmac_hex(const std::string& key, const std::string& msg) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len);
  return hex(out, len);
}

bool same(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string to_text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> to_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

std::string this_host() {
  char h[256] = {0};
  ::gethostname(h, sizeof(h) - 1);
  return h;
}

struct Claim {
  int64_t ticket = 0;
  int rank = -1;
  int world = 0;
  long pid = 0;
  std::string host, proof;
  std::string who() const { return str_cat("pid ", pid, " on ", host, " (ticket ", ticket, ")"); }
};

std::string claim_proof(const std::string& secret, const std::string& challenge, int rank, int world,
                        int64_t t) {
  return hmac_hex(secret, str_cat("claim|", challenge, "|", rank, "|", world, "|", t));
}

std::string ok_mac(const std::string& secret, const std::string& challenge, int64_t t) {
  return hmac_hex(secret, str_cat("ok|", challenge, "|", t));
}

std::optional<Claim> parse_claim(int64_t t, const std::string& text) {
  Claim c;
  c.ticket = t;
  std::istringstream in(text);
  if (!(in >> c.rank >> c.world >> c.pid >> c.host >> c.proof)) return std::nullopt;
  return c;
}

}  // namespace

int listen_for_store(bool loopback, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw CommError(str_cat(rank_prefix(), " store: socket() failed: ", std::strerror(errno), "."));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(loopback ? INADDR_LOOPBACK : INADDR_ANY);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 1024) != 0) {
    int e = errno;
    ::close(fd);
    throw CommError(
        str_cat(rank_prefix(), " store: rank 0 cannot listen on ", loopback ? "127.0.0.1" : "0.0.0.0", ":",
                port, ": ", std::strerror(e),
                ". Another program may hold the port: pass another MASTER_PORT (--master-port), or "
                "0 to let dtrain run pick a free one."));
  }
  return fd;
}

int bound_port(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

namespace {

void check_resolves(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (res) ::freeaddrinfo(res);
  if (rc != 0) {
    throw ValueError(str_cat(rank_prefix(), " store: MASTER_ADDR '", host, "' does not resolve (",
                             ::gai_strerror(rc), "). Set MASTER_ADDR (--master-addr) to rank 0's address."));
  }
}

std::string what_of(const std::exception& e) {
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

// Rank 0's judge of claims. During admission (admit()) it reads claims in ticket order until every rank is
// admitted, refusing strangers and stopping the job on conflicts; afterwards a thread of its own answers late
// claimants (a refusal naming the reason) every kLatePoll, for as long as the store lives.
class Doorkeeper {
 public:
  static constexpr std::chrono::milliseconds kLatePoll{250};

  Doorkeeper(BoundedStore* store, JobStoreOptions o, std::string challenge)
      : store_(store), o_(std::move(o)), challenge_(std::move(challenge)) {}
  ~Doorkeeper() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void admit() {
    const auto deadline = StoreClock::now() + o_.timeout;
    while (static_cast<int>(admitted_.size()) < o_.world_size) {
      if (store_->add(kTickets, 0) < next_) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - StoreClock::now());
        if (left.count() <= 0) {
          std::string missing;
          for (int r = 0; r < o_.world_size; ++r) {
            if (!admitted_.count(r)) missing += str_cat(missing.empty() ? "" : ", ", r);
          }
          throw TimeoutError(
              str_cat(rank_prefix(), " joining the job: ranks [", missing, "] did not join within ",
                      o_.timeout.count(),
                      " ms. Check that every rank started, with the same MASTER_ADDR/MASTER_PORT, "
                      "or raise DTRAIN_TIMEOUT."));
        }
        try {
          store_->wait({claim_key(next_)}, std::min(left, std::chrono::milliseconds(1000)));
        } catch (const std::exception&) {
          // not there yet; look again
        }
        continue;
      }
      judge(next_++, false);
    }
    for (auto& [r, c] : admitted_) {
      store_->set(verdict_key(c.ticket), to_bytes("ok " + ok_mac(o_.secret, challenge_, c.ticket)));
    }
    thread_ = std::thread([this] { watch_late_claims(); });
  }

 private:
  // Judges ticket t: admits it, refuses it (a stranger; `late`: the job is complete), or stops the job.
  void judge(int64_t t, bool late) {
    std::optional<Claim> c = parse_claim(t, to_text(store_->get(claim_key(t))));
    if (!c) {
      store_->set(verdict_key(t), to_bytes("refused its claim is malformed"));
      log_warn("refused ticket ", t, " at the job's store: a malformed claim");
    } else if (!same(c->proof, claim_proof(o_.secret, challenge_, c->rank, c->world, t))) {
      store_->set(verdict_key(t),
                  to_bytes(str_cat("refused it does not prove the job's secret (", c->who(), ")")));
      log_warn("refused a process claiming rank ", c->rank, ", ", c->who(),
               ": it does not prove the job's secret. It is not part of this job; the job goes on.");
    } else if (late) {
      std::string why =
          str_cat("the job's ", o_.world_size, " ranks have all joined already (rank ", c->rank, " is ",
                  admitted_.count(c->rank) ? admitted_[c->rank].who() : "taken", "); this process (",
                  c->who(), ") is one too many. Give each process its own RANK");
      store_->set(verdict_key(t), to_bytes("refused " + why));
      log_warn("refused a late process claiming rank ", c->rank, ", ", c->who(),
               ": every rank has joined already. The job goes on.");
    } else if (c->world != o_.world_size) {
      abort_job(str_cat("rank ", c->rank, " (", c->who(), ") says the world size is ", c->world,
                        " but rank 0 (", admitted_.count(0) ? admitted_[0].who() : "this process", ") says ",
                        o_.world_size, ". Start every rank with the same WORLD_SIZE."),
                t);
    } else if (c->rank < 0 || c->rank >= o_.world_size) {
      abort_job(str_cat(c->who(), " claims rank ", c->rank, ", outside 0..", o_.world_size - 1,
                        ". Start the ranks with RANK from 0 to WORLD_SIZE - 1."),
                t);
    } else if (admitted_.count(c->rank)) {
      abort_job(str_cat("rank ", c->rank, " was claimed twice: by ", admitted_[c->rank].who(), " and by ",
                        c->who(), ". Give each process its own RANK (0 to ", o_.world_size - 1, ")."),
                t);
    } else {
      admitted_[c->rank] = *c;
    }
  }

  [[noreturn]] void abort_job(const std::string& why, int64_t also) {
    int64_t told = 0;
    for (auto& [r, c] : admitted_) {
      if (c.pid == ::getpid()) continue;  // this process: it raises below
      store_->set(verdict_key(c.ticket), to_bytes("abort " + why));
      ++told;
    }
    store_->set(verdict_key(also), to_bytes("abort " + why));
    ++told;
    // This process hosts the store: it stays until the others read their verdict (or a few seconds pass), so
    // that they get the reason rather than a closed connection.
    auto until = StoreClock::now() + std::chrono::seconds(3);
    while (store_->add(kReadRefusals, 0) < told && StoreClock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw ValueError(str_cat(rank_prefix(), " joining the job: ", why));
  }

  void watch_late_claims() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, kLatePoll);
      if (stop_) return;
      lock.unlock();
      try {
        int64_t n = store_->call("looking for late claims", StoreClock::now() + std::chrono::seconds(1),
                                 [](c10d::Store& s) { return s.add(kTickets, 0); });
        while (next_ <= n) judge(next_++, true);
      } catch (const std::exception&) {
        // the store is failing: the job's own calls report it
      }
      lock.lock();
    }
  }

  BoundedStore* store_;  // owns this Doorkeeper (BoundedStore::hold)
  JobStoreOptions o_;
  std::string challenge_;
  std::map<int, Claim> admitted_;
  int64_t next_ = 1;  // the next ticket to judge
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace

std::string random_secret() { return random_hex(32); }

std::string job_secret_from_env(const EnvMap& env) {
  if (auto s = env_get(env, "DTRAIN_JOB_SECRET"); s && !s->empty()) return *s;
  auto path = env_get(env, "DTRAIN_JOB_SECRET_FILE");
  if (!path || path->empty()) return "";
  struct stat st {};
  if (::stat(path->c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw ValueError(str_cat("DTRAIN_JOB_SECRET_FILE = '", *path, "' is not a readable file (",
                             std::strerror(errno),
                             "). Copy node 0's secret file to this host and point "
                             "DTRAIN_JOB_SECRET_FILE at it."));
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%03o", static_cast<unsigned>(st.st_mode & 0777));
    throw ValueError(str_cat("DTRAIN_JOB_SECRET_FILE = '", *path, "' can be read by other users (mode ", mode,
                             "). Run `chmod 600 ", *path, "`."));
  }
  std::ifstream in(*path);
  std::string secret;
  std::getline(in, secret);
  if (secret.empty()) {
    throw ValueError(str_cat("DTRAIN_JOB_SECRET_FILE = '", *path, "' is empty. Copy node 0's secret file."));
  }
  return secret;
}

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

bool single_host_job(const EnvMap& env) {
  if (is_loopback_host(env_get(env, "MASTER_ADDR").value_or(""))) return true;
  auto local = env_get(env, "LOCAL_WORLD_SIZE"), world = env_get(env, "WORLD_SIZE");
  return local && world && !local->empty() && *local == *world;
}

JobStore open_job_store(const JobStoreOptions& o) {
  const auto deadline = StoreClock::now() + o.timeout;
  const bool server = o.rank == 0;
  if (!server) check_resolves(o.host);
  c10d::TCPStoreOptions so;
  so.isServer = server;
  so.numWorkers = o.world_size;
  so.waitWorkers = false;
  so.timeout = o.timeout;
  so.port = static_cast<uint16_t>(o.port);
  if (server) {
    int fd = o.listen_fd >= 0 ? o.listen_fd : listen_for_store(o.loopback_only, o.port);
    so.masterListenFd = fd;
    so.port = static_cast<uint16_t>(bound_port(fd));
  }
  const int port = so.port;
  const std::string where = str_cat("the job's store at ", o.host, ":", port, " (hosted by rank 0)");
  auto holder = std::make_shared<c10::intrusive_ptr<c10d::Store>>();
  std::string host = o.host;
  try {
    run_bounded(
        server ? str_cat("starting ", where) : str_cat("connecting to ", where), deadline,
        [holder, host, so] { *holder = c10::make_intrusive<c10d::TCPStore>(host, so); },
        "Rank 0 may not have started, be stopped, or MASTER_ADDR/MASTER_PORT may not reach it (a port "
        "that accepts connections but never answers is not a dtrain store).");
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(str_cat(rank_prefix(), " cannot reach ", where, ": ", what_of(e),
                            " Check MASTER_ADDR/MASTER_PORT and that rank 0 is running."));
  }
  auto store = c10::make_intrusive<BoundedStore>(*holder, where, o.timeout);
  if (server)
    log_debug("the job's store listens on ", o.loopback_only ? "127.0.0.1" : "every interface", ", port ",
              port);

  // Admission.
  std::string challenge;
  if (server) {
    challenge = random_secret().substr(0, 32);
    store->set(kChallenge, to_bytes(challenge));
  } else {
    challenge = to_text(store->get(kChallenge));
  }
  int64_t t = store->add(kTickets, 1);
  store->set(claim_key(t), to_bytes(str_cat(o.rank, " ", o.world_size, " ", ::getpid(), " ", this_host(), " ",
                                            claim_proof(o.secret, challenge, o.rank, o.world_size, t))));
  if (server) {
    auto keeper = std::make_shared<Doorkeeper>(store.get(), o, challenge);
    keeper->admit();
    store->hold(keeper);
  }
  const std::string verdict = to_text(store->get(verdict_key(t)));
  if (verdict.rfind("ok ", 0) == 0 && same(verdict.substr(3), ok_mac(o.secret, challenge, t))) {
    return {store, port};
  }
  if (verdict.rfind("refused ", 0) == 0) {
    throw ValueError(
        str_cat(rank_prefix(), " joining the job at ", o.host, ":", port, ": rank 0 refused this process: ",
                verdict.substr(8), ". ", o.secret.empty() ? "This process has no job secret. " : "",
                "Start it with the job's secret: DTRAIN_JOB_SECRET, or DTRAIN_JOB_SECRET_FILE naming "
                "a file only you can read, as `dtrain run` on node 0 printed."));
  }
  if (verdict.rfind("abort ", 0) == 0) {
    store->add(kReadRefusals, 1);
    throw ValueError(
        str_cat(rank_prefix(), " joining the job at ", o.host, ":", port, ": ", verdict.substr(6)));
  }
  throw CommError(
      str_cat(rank_prefix(), " joining the job at ", o.host, ":", port,
              ": the admission answer is not signed with the job's secret; another process may be "
              "writing to the job's store."));
}

}  // namespace dtrain::comm
