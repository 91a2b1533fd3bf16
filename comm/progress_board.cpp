// ProgressBoard; see progress_board.h.
#include "comm/detail/progress_board.h"

#include <algorithm>

#include "core/error.h"

namespace dtrain::comm {

ProgressBoard::ProgressBoard(c10::intrusive_ptr<BoundedStore> store, std::string group,
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
  bool store_ok = true;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (!stop_) cv_.wait_for(lock, kPublishInterval);
    // On stop, one last update: a rank that leaves (an error, or a program that ends early) leaves its true
    // last collective on the board for the others' diagnosis.
    bool last = stop_;
    uint64_t seq = entered_seq_;
    if (seq == published || !store_ok) {
      if (last) return;
      continue;
    }
    std::string value = str_cat(seq, " ", entered_op_);
    lock.unlock();
    try {
      std::string k = key(group_rank_);
      store_->call("a progress update", StoreClock::now() + kReadBound, [k, value](c10d::Store& s) {
        s.set(k, std::vector<uint8_t>(value.begin(), value.end()));
      });
      published = seq;
    } catch (const std::exception&) {
      // The store is gone or silent (its host died or froze): progress stops being published; diagnose()
      // says so.
      store_ok = false;
    }
    lock.lock();
    if (last) return;
  }
}

std::string ProgressBoard::diagnose(uint64_t seq, const std::vector<int>& peers, const std::string& op) {
  if (!store_) return std::string();
  std::vector<std::string> keys;
  std::vector<int> who;
  for (size_t g = 0; g < global_ranks_.size(); ++g) {
    int peer = global_ranks_[g];
    if (static_cast<int>(g) == group_rank_ || std::find(peers.begin(), peers.end(), peer) == peers.end()) {
      continue;
    }
    keys.push_back(key(static_cast<int>(g)));
    who.push_back(peer);
  }
  // One bounded call reads every peer's entry ("" when it never published).
  std::vector<std::string> values =
      store_->call("reading the peers' progress", StoreClock::now() + kReadBound, [keys](c10d::Store& s) {
        std::vector<std::string> v;
        for (const auto& k : keys) {
          if (!s.check({k})) {
            v.emplace_back();
            continue;
          }
          auto bytes = s.get(k);
          v.emplace_back(bytes.begin(), bytes.end());
        }
        return v;
      });
  std::string out;
  for (size_t i = 0; i < keys.size(); ++i) {
    uint64_t their_seq = 0;
    std::string their_op = "none";
    const std::string& v = values[i];
    if (!v.empty()) {
      auto sp = v.find(' ');
      their_seq = std::stoull(v.substr(0, sp));
      if (sp != std::string::npos) their_op = v.substr(sp + 1);
    }
    if (their_seq < seq) {
      out +=
          str_cat("Rank ", who[i],
                  " has not entered it, as far as its published progress shows (last seen entering: ",
                  their_seq == 0 ? std::string("none") : str_cat("seq ", their_seq, ", ", their_op), "). ");
    } else if (their_seq == seq && their_op != op) {
      out += str_cat("Rank ", who[i], " entered ", their_op, " as seq ", seq, " instead. ");
    }
  }
  if (!out.empty()) out.pop_back();
  return out;
}

}  // namespace dtrain::comm
