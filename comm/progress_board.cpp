// ProgressBoard; see progress_board.h.
#include "comm/progress_board.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>

#include "core/error.h"

namespace dtrain::comm {

namespace {
// How often a rank's progress reaches the store. Timeouts are seconds, so a rank that entered a collective
// within the last interval can at worst be reported as behind.
constexpr auto kPublishInterval = std::chrono::milliseconds(100);
}  // namespace

ProgressBoard::ProgressBoard(c10::intrusive_ptr<c10d::Store> store, std::string group,
                             std::vector<int> global_ranks, int group_rank)
    : store_(std::move(store)),
      group_(std::move(group)),
      global_ranks_(std::move(global_ranks)),
      group_rank_(group_rank) {
  if (store_) publisher_ = std::thread([this] { publish_loop(); });
}

ProgressBoard::~ProgressBoard() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (publisher_.joinable()) publisher_.join();
}

std::string ProgressBoard::key(int group_rank) const {
  return str_cat("dtrain/progress/", group_, "/", group_rank);
}

void ProgressBoard::enter(uint64_t seq, const char* op) {
  std::lock_guard<std::mutex> lock(mu_);
  entered_seq_ = seq;
  entered_op_ = op;
}

void ProgressBoard::publish_loop() {
  uint64_t published = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, kPublishInterval);
    uint64_t seq = entered_seq_;
    if (seq == published || stop_) continue;
    std::string value = str_cat(seq, " ", entered_op_);
    lock.unlock();
    try {
      store_->set(key(group_rank_), std::vector<uint8_t>(value.begin(), value.end()));
      published = seq;
    } catch (const std::exception&) {
      // The store is gone (its host rank died): progress simply stops being published; diagnose() says so.
    }
    lock.lock();
  }
}

std::optional<std::string> ProgressBoard::diagnose(uint64_t seq, const std::vector<int>& peers,
                                                   const std::string& op) {
  if (!store_) return std::string();
  std::string out;
  try {
    for (size_t g = 0; g < global_ranks_.size(); ++g) {
      int peer = global_ranks_[g];
      if (static_cast<int>(g) == group_rank_ || std::find(peers.begin(), peers.end(), peer) == peers.end()) {
        continue;
      }
      uint64_t their_seq = 0;
      std::string their_op = "none";
      if (store_->check({key(static_cast<int>(g))})) {
        auto bytes = store_->get(key(static_cast<int>(g)));
        std::string v(bytes.begin(), bytes.end());
        auto sp = v.find(' ');
        their_seq = std::stoull(v.substr(0, sp));
        if (sp != std::string::npos) their_op = v.substr(sp + 1);
      }
      if (their_seq < seq) {
        out +=
            str_cat("Rank ", peer, " has not entered it (last entered: ",
                    their_seq == 0 ? std::string("none") : str_cat("seq ", their_seq, ", ", their_op), "). ");
      } else if (their_seq == seq && their_op != op) {
        out += str_cat("Rank ", peer, " entered ", their_op, " as seq ", seq, " instead. ");
      }
    }
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (!out.empty()) out.pop_back();
  return out;
}

}  // namespace dtrain::comm
