// The timeline record; see timeline.h.
#include "comm/timeline.h"

#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>

namespace dtrain::comm::timeline {

namespace {
std::mutex g_mu;
std::vector<Event> g_events;  // guarded by g_mu
std::atomic<bool> g_on{false};
std::atomic<int64_t> g_wait_ns{0};
}  // namespace

void enable(bool on) { g_on = on; }
bool enabled() { return g_on.load(std::memory_order_relaxed); }

void record(Event e) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(g_mu);
  g_events.push_back(std::move(e));
}

std::vector<Event> take() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<Event> out;
  out.swap(g_events);
  return out;
}

int64_t to_us(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

double take_wait_seconds() { return static_cast<double>(g_wait_ns.exchange(0)) * 1e-9; }

void add_wait(std::chrono::steady_clock::duration d) {
  g_wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

Span::Span(const char* name, const char* category)
    : name_(name), category_(category), start_(std::chrono::steady_clock::now()), on_(enabled()) {}

Span::~Span() {
  if (!on_) return;
  const auto end = std::chrono::steady_clock::now();
  record({name_, category_, to_us(start_), to_us(end) - to_us(start_), ""});
}

std::string events_json(const std::vector<Event>& events) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& e : events) a.push_back({e.name, e.category, e.start_us, e.dur_us, e.detail});
  return a.dump();
}

std::vector<Event> events_from_json(const std::string& text) {
  std::vector<Event> out;
  for (const auto& x : nlohmann::json::parse(text)) {
    out.push_back({x[0].get<std::string>(), x[1].get<std::string>(), x[2].get<int64_t>(), x[3].get<int64_t>(),
                   x[4].get<std::string>()});
  }
  return out;
}

std::string chrome_trace(const std::vector<std::vector<Event>>& ranks) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", r},
                      {"args", {{"name", "rank " + std::to_string(r)}}}});
    events.push_back(
        {{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", r},
                      {"tid", 1},
                      {"args", {{"name", "communication"}}}});
    for (const auto& e : ranks[r]) {
      nlohmann::json j{{"name", e.name},
                       {"cat", e.category},
                       {"ph", "X"},
                       {"ts", e.start_us},
                       {"dur", e.dur_us},
                       {"pid", r},
                       {"tid", e.category == "comm" ? 1 : 0}};
      if (!e.detail.empty()) j["args"] = {{"detail", e.detail}};
      events.push_back(std::move(j));
    }
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace dtrain::comm::timeline
