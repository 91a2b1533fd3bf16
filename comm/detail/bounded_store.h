// BoundedStore: the job's key-value store (c10d's TCPStore, hosted by rank 0) with every access bounded by a
// deadline. c10d's client blocks without end when the host stops answering (a frozen rank 0, a cut link, a
// port that accepts but never replies); here each call runs on a helper thread and the caller waits at most
// until its deadline, then gets a CommError that names the store's host. A call that never returns keeps its
// helper thread (detached at destruction); later calls fail at once instead of queueing behind it.
//
// run_bounded() gives the same bound to any other blocking set-up call (a store's constructor, Gloo's
// full-mesh connect).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace dtrain::comm {

using StoreClock = std::chrono::steady_clock;

// Runs `fn` on a thread of its own and waits until `deadline`. Returns when fn returns, rethrows what it
// throws; past the deadline throws CommError "<what> did not finish within N ms" + `hint`, leaving the thread
// to finish (or not) on its own. `fn` must own what it touches (captured by value).
void run_bounded(const std::string& what, StoreClock::time_point deadline, std::function<void()> fn,
                 const std::string& hint = "");

// Thread-safe: calls from several threads run one at a time on the helper thread, in arrival order.
class BoundedStore : public c10d::Store {
 public:
  // `where` names the store in errors, e.g. "the job's store at 10.0.0.1:29500 (hosted by rank 0)". `timeout`
  // bounds each call (and is c10d's timeout for waits on keys).
  BoundedStore(c10::intrusive_ptr<c10d::Store> inner, std::string where, std::chrono::milliseconds timeout);
  ~BoundedStore() override;

  const std::string& where() const { return where_; }

  // Keeps `owned` alive as long as the store, and destroys it before the store stops serving calls (for a
  // helper that uses the store from a thread of its own).
  void hold(std::shared_ptr<void> owned) { held_.push_back(std::move(owned)); }

  // Runs fn(inner store) on the helper thread with a deadline of its own (shorter than the store's timeout,
  // e.g. for a diagnosis that must end before a collective's deadline).
  template <typename F>
  auto call(const char* what, StoreClock::time_point deadline, F fn)
      -> std::invoke_result_t<F, c10d::Store&> {
    using R = std::invoke_result_t<F, c10d::Store&>;
    if constexpr (std::is_void_v<R>) {
      submit(what, deadline, [fn](c10d::Store& s) mutable { fn(s); });
    } else {
      auto out = std::make_shared<std::optional<R>>();
      submit(what, deadline, [fn, out](c10d::Store& s) mutable { out->emplace(fn(s)); });
      return std::move(**out);
    }
  }

  // c10d::Store, each call bounded by the store's timeout (waits: by their own timeout) plus a second.
  c10::intrusive_ptr<c10d::Store> clone() override;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& current,
                                  const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  void append(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) override;
  bool hasExtendedApi() const override { return extended_; }
  void setTimeout(const std::chrono::milliseconds& timeout) override;

 private:
  struct State;
  void submit(const char* what, StoreClock::time_point deadline, std::function<void(c10d::Store&)> fn);
  StoreClock::time_point bound(std::chrono::milliseconds wait) const;

  std::shared_ptr<State> state_;
  std::string where_;
  bool extended_;
  std::vector<std::shared_ptr<void>> held_;  // destroyed first, in ~BoundedStore
};

}  // namespace dtrain::comm
