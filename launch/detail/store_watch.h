// StoreWatch: a launcher on node 1, 2, ... watches the job's store port on rank 0's host (a TCP connect once
// a second, closed at once). Once the port has answered, a refused connect means rank 0's process is gone,
// and with it the job: the launcher then stops its own ranks, which may be unable to learn it themselves (a
// rank frozen, or one waiting on something other than its peers).
#pragma once

#include <chrono>
#include <string>

namespace dtrain::launch::detail {

class StoreWatch {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kInterval{1000};

  StoreWatch(std::string host, int port) : host_(std::move(host)), port_(port) {}

  // Probes when a probe is due (at most once per kInterval; a probe waits up to 300 ms); true once the port,
  // which accepted before, refuses.
  bool gone();
  // Milliseconds until the next probe is due (for the launcher's poll timeout).
  int due_in_ms() const;
  std::string where() const { return host_ + ":" + std::to_string(port_); }

 private:
  std::string host_;
  int port_;
  bool answered_ = false;  // the port accepted a connection at least once
  Clock::time_point next_ = Clock::now();
};

}  // namespace dtrain::launch::detail
