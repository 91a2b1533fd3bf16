// ShmAgreement: the agreement exchange (backend.h, "Agreement") through shared memory, for a group whose
// ranks all run on one host. Each rank owns a slot in a small segment (one per group) and writes there the
// signature of each signed collective with its number; the others read it once the number is there. No
// engine round trip and no thread hand-off: the check costs a few microseconds instead of one small
// collective (bench/RESULTS.md, "The agreement check's cost").
//
// Slots keep the last two signatures of their rank: a rank can publish collective s + 2 only after it read
// every rank's s + 1, which each rank publishes only after reading all of s, so no signature is overwritten
// before every rank has read it.
//
// The segment is created by group rank 0 (mode 0600, a random name), opened by the others, and unlinked as
// soon as every rank mapped it: nothing is left in /dev/shm, even when a rank is killed later.
//
// A rank that dies closes no connection a waiter here would see, so each slot also names its process (pid,
// start time, PID namespace): a wait that sleeps looks at /proc every slice and gives up as soon as the rank
// it waits for has exited, instead of at the op's deadline.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/work.h"

namespace dtrain::comm {

class ShmAgreement {
 public:
  using Clock = std::chrono::steady_clock;

  // Group rank 0: creates a segment for `size` ranks; returns nullptr (and `*why`) when it cannot.
  static std::unique_ptr<ShmAgreement> create(int size, std::string* why);
  // The other ranks: maps the segment `name` (from create's name()) and checks its `nonce`; nullptr (and
  // `*why`) when it cannot: the rank runs on another host or in another IPC namespace.
  static std::unique_ptr<ShmAgreement> open(const std::string& name, uint64_t nonce, int rank, int size,
                                            std::string* why);
  ~ShmAgreement();
  ShmAgreement(const ShmAgreement&) = delete;
  ShmAgreement& operator=(const ShmAgreement&) = delete;

  const std::string& name() const { return name_; }
  uint64_t nonce() const { return nonce_; }
  // Removes the segment's name (every rank calls it once all mapped it; the mappings stay).
  void unlink();

  // Writes this rank's signature of signed collective `s` (1, 2, ... in issue order) and wakes the ranks
  // waiting for it.
  void publish(uint64_t s, const int64_t* signature);
  // Waits until every rank published collective `s`, until `until`, or until `*stop` turns true; copies every
  // rank's signature (kSignatureFields each, in group-rank order) to `all` and returns true when all did.
  bool gather(uint64_t s, int64_t* all, Clock::time_point until, const std::atomic<bool>* stop = nullptr);
  // The group ranks that have not published collective `s`.
  std::vector<int> missing(uint64_t s) const;
  // Whether group rank r's process is known to have exited (it ran in this PID namespace and /proc no longer
  // shows it, shows it as a zombie, or shows another process under its pid); false while it runs, or where
  // this cannot be told. `pid` (optional) gets its pid.
  bool exited(int r, int* pid = nullptr) const;

 private:
  struct Slot;
  ShmAgreement(std::string name, uint64_t nonce, int rank, int size, void* base, size_t bytes);
  void sign_slot();  // writes this process's identity into its slot
  Slot& slot(int r) const;
  // Waits for rank r to publish s (spinning briefly, then sleeping on its futex); false at `until` or stop.
  bool wait_for(int r, uint64_t s, Clock::time_point until, const std::atomic<bool>* stop);

  std::string name_;
  uint64_t nonce_;
  int rank_;
  int size_;
  void* base_;
  size_t bytes_;
  bool linked_ = true;
};

}  // namespace dtrain::comm
