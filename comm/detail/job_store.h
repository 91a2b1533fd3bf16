// The job's store and its admission: rank 0 hosts a c10d TCPStore (bound to loopback when every rank is on
// this host), every rank connects within the timeout, and then joins: it proves that it knows the job's
// secret, and rank 0 admits each rank number once, for one world size. A process without the secret is
// refused (both sides say so) and the job goes on; two valid claims to one rank, or a claim with another
// world size, stop the job on every rank with an error naming both claimants.
//
// Join protocol (keys under dtrain/join/, values text):
//   challenge      rank 0: 32 random hex digits, set before anyone can be admitted
//   tickets        counter: each claimant takes the next ticket t with add(tickets, 1)
//   claim/t        "rank world pid host proof"   proof = HMAC-SHA256(secret, "claim|challenge|rank|world|t")
//   verdict/t      rank 0: "ok <mac>" (mac = HMAC(secret, "ok|challenge|t")), "refused <why>" or "abort
//   <why>"
// Rank 0 judges the claims in ticket order until every rank is admitted, then writes the ok verdicts: joining
// is a barrier. A verdict "ok" without the right mac is ignored (a stranger cannot admit anyone).
#pragma once

#include <chrono>
#include <string>

#include "comm/detail/bounded_store.h"
#include "core/env.h"

namespace dtrain::comm {

struct JobStoreOptions {
  std::string host;  // rank 0's address (MASTER_ADDR)
  int port = 0;      // 0 on rank 0: a free port (read it back from the store's where())
  int rank = 0;
  int world_size = 1;
  bool loopback_only = false;  // rank 0 listens on 127.0.0.1 only (the ranks reach it through loopback)
  std::string secret;          // the job's secret; empty: the job has none (proofs still bind rank and size)
  int listen_fd = -1;          // rank 0: a socket from listen_for_store() to serve on (else one is opened)
  std::chrono::milliseconds timeout{300000};
};

struct JobStore {
  c10::intrusive_ptr<BoundedStore> store;
  int port = 0;  // the port rank 0 bound (the one it chose when opts.port was 0)
};

// Rank 0 starts the store, the others connect, each within the timeout; then every rank joins (see above).
// Errors: CommError naming host:port and what did not answer; ValueError for a refused or conflicting claim.
JobStore open_job_store(const JobStoreOptions& opts);

// Rank 0's listening socket for the store, on 127.0.0.1 or on every interface; port 0 picks a free port.
int listen_for_store(bool loopback_only, int port);
// The port a socket from listen_for_store() is bound to.
int bound_port(int fd);

// The job's secret from DTRAIN_JOB_SECRET, or from the file DTRAIN_JOB_SECRET_FILE (which must be readable by
// its owner only); "" when neither is set. ValueError on a file that cannot be read or is open to others.
std::string job_secret_from_env(const EnvMap& env);

// 64 random hex digits from the kernel's random source, for `dtrain run` and the mpi backend.
std::string random_secret();

// "localhost", 127.x.y.z or ::1.
bool is_loopback_host(const std::string& host);

// True when every rank runs on this host, as far as the launcher's variables say: MASTER_ADDR is a loopback
// address, or LOCAL_WORLD_SIZE equals WORLD_SIZE.
bool single_host_job(const EnvMap& env);

}  // namespace dtrain::comm
