// The op-by-op profile; see op_profile.h.
#include "train/op_profile.h"

#include <chrono>
#include <fstream>
#include <mutex>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dtrain::train {

namespace {

using Clock = std::chrono::steady_clock;

// Per thread: the ops open on this thread, each with its start and the time its children took.
struct Open {
  Clock::time_point start;
  int64_t children_ns = 0;
};
thread_local std::vector<Open> t_open;

std::mutex g_mu;
std::map<std::string, OpProfile::Totals> g_totals;  // guarded by g_mu

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction&) {
  t_open.push_back({Clock::now(), 0});
  return nullptr;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext*) {
  if (t_open.empty()) return;  // entered before the profile began
  const Open o = t_open.back();
  t_open.pop_back();
  const int64_t total = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - o.start).count();
  if (!t_open.empty()) t_open.back().children_ns += total;
  std::lock_guard<std::mutex> lock(g_mu);
  auto& t = g_totals[fn.name()];
  ++t.calls;
  t.self_ns += total - o.children_ns;
}

}  // namespace

OpProfile::~OpProfile() { stop(); }

void OpProfile::stop() {
  if (!recording_) return;
  at::removeCallback(handle_);
  recording_ = false;
}

void OpProfile::on_step_end(Trainer& trainer, const StepInfo& info) {
  if (recording_) {
    ++steps_;
    if (info.step >= trainer.options().steps) stop();  // not the evaluation after the last step
  } else if (info.step >= 2) {  // the first two steps warm up (allocations, plan caches)
    std::lock_guard<std::mutex> lock(g_mu);
    g_totals.clear();
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(on_enter, on_exit).scopes({at::RecordScope::FUNCTION}).needsInputs(false));
    recording_ = true;
  }
}

void OpProfile::on_train_end(Trainer& trainer) {
  stop();
  if (!trainer.lead()) return;
  nlohmann::json ops = nlohmann::json::object();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const auto& [name, t] : g_totals) {
      ops[name] = {{"calls", t.calls}, {"self_us", static_cast<double>(t.self_ns) / 1e3}};
    }
  }
  std::ofstream f(path_);
  if (!f) {
    throw ValueError(str_cat("DTRAIN_OP_PROFILE=", path_,
                             " cannot be written. Name a file in a folder that exists and is writable."));
  }
  f << nlohmann::json{{"tool", "dtrain"}, {"steps", steps_}, {"ops", ops}}.dump(1) << "\n";
}

}  // namespace dtrain::train
