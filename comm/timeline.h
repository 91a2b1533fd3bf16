// A process-wide record of when this rank did what, for a Chrome-trace (Perfetto) timeline as Horovod's
// shows: every op a Work was waited on for (from its issue to the moment its waiter saw it finished), and the
// spans a trainer marks (forward, backward, optimizer). Off until enable(true); then each event costs a lock
// and a push. Separately, always on: the time the process spent blocked in Work::wait (the communication that
// computation did not hide). Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::comm::timeline {

struct Event {
  std::string name;      // "all_reduce", "forward", ...
  std::string category;  // "comm" or "compute"
  int64_t start_us = 0;  // steady clock, microseconds (one clock for every process of a machine)
  int64_t dur_us = 0;
  std::string detail;  // shown with the event ("seq 12, group world")
};

void enable(bool on);
bool enabled();
void record(Event e);  // kept only while enabled
// The events recorded so far, oldest first; the record is emptied.
std::vector<Event> take();
int64_t to_us(std::chrono::steady_clock::time_point t);

// Seconds spent blocked in Work::wait since the last call (process-wide), and starts counting anew.
double take_wait_seconds();
void add_wait(std::chrono::steady_clock::duration d);

// Records [construction, destruction) as a compute event while enabled.
class Span {
 public:
  Span(const char* name, const char* category = "compute");
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* name_;
  const char* category_;
  std::chrono::steady_clock::time_point start_;
  bool on_;
};

// `events` of every rank (ranks[r] is rank r's) as one Chrome trace JSON document: one process per rank,
// compute on thread 0 and communication on thread 1.
std::string chrome_trace(const std::vector<std::vector<Event>>& ranks);
// One rank's events as a JSON array (what the ranks gather).
std::string events_json(const std::vector<Event>& events);
std::vector<Event> events_from_json(const std::string& text);

}  // namespace dtrain::comm::timeline
