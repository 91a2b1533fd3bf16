// ProgressBoard: each rank publishes the last collective it entered (sequence number and op) to the job's
// key-value store, so that a rank whose collective times out can name the peers that never arrived.
// Publishing happens on a background thread a few times a second, so the collectives themselves only take an
// uncontended lock.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/detail/bounded_store.h"

namespace dtrain::comm {

// Thread-safety: enter() may be called from any one thread; diagnose() from any thread.
class ProgressBoard {
 public:
  // `global_ranks[g]` is the global rank of group rank g; `group_rank` is this process's index in it.
  ProgressBoard(c10::intrusive_ptr<BoundedStore> store, std::string group, std::vector<int> global_ranks,
                int group_rank);
  ~ProgressBoard();
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  // Records that this rank entered collective `seq` (op name must be a string literal or otherwise outlive
  // the board).
  void enter(uint64_t seq, const char* op);
  // For collective `seq` (`op`) that did not complete: "Rank 2 has not entered it (last seen entering: seq 6,
  // broadcast)." for every peer in `peers` (global ranks) that is behind, and "Rank 3 entered barrier as seq
  // 7 instead." for a peer that issued a different collective; "" if nothing is known to be wrong. Reads the
  // store within kReadBound; CommError (naming the store's host) when it does not answer.
  std::string diagnose(uint64_t seq, const std::vector<int>& peers, const std::string& op);

  // How long a diagnosis may wait for the store, and how often progress is published.
  static constexpr std::chrono::milliseconds kReadBound{1000};
  static constexpr std::chrono::milliseconds kPublishInterval{100};

 private:
  void publish_loop();
  std::string key(int group_rank) const;

  c10::intrusive_ptr<BoundedStore> store_;
  std::string group_;
  std::vector<int> global_ranks_;
  int group_rank_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t entered_seq_ = 0;         // guarded by mu_
  const char* entered_op_ = "none";  // guarded by mu_; published together with entered_seq_
  bool stop_ = false;                // guarded by mu_
  std::thread publisher_;
};

}  // namespace dtrain::comm
