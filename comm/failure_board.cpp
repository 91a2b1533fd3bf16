// FailureBoard; see failure_board.h.
#include "comm/detail/failure_board.h"

#include <mutex>
#include <set>
#include <sstream>

#include "core/error.h"

namespace dtrain::comm {

namespace {

const char* const kKey = "dtrain/failures";  // lines "tag\trank\tmessage\n", appended

// The tags this process failed at itself (all its groups share one store).
std::mutex g_mu;
std::set<std::string> g_failed_here;  // guarded by g_mu

std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\t') c = ' ';
  }
  return s;
}

}  // namespace

void FailureBoard::post(const std::string& tag, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_failed_here.insert(tag);
  }
  try {
    std::string line = str_cat(one_line(tag), "\t", rank_, "\t", one_line(message), "\n");
    store_->call("a failure report", StoreClock::now() + kStoreBound,
                 [line](c10d::Store& s) { s.append(kKey, std::vector<uint8_t>(line.begin(), line.end())); });
  } catch (...) {
    // the store is gone too: the others fall back on their timeouts
  }
}

std::optional<std::string> FailureBoard::foreign_failure() {
  std::string text;
  try {
    text = store_->call("reading the failure board", StoreClock::now() + kStoreBound, [](c10d::Store& s) {
      if (!s.check({kKey})) return std::string();
      std::vector<uint8_t> v = s.get(kKey);
      return std::string(v.begin(), v.end());
    });
    if (text.empty()) return std::nullopt;
  } catch (...) {
    return std::nullopt;
  }
  std::istringstream in(text);
  std::string line;
  std::lock_guard<std::mutex> lock(g_mu);
  while (std::getline(in, line)) {
    auto a = line.find('\t');
    auto b = a == std::string::npos ? a : line.find('\t', a + 1);
    if (b == std::string::npos) continue;
    std::string tag = line.substr(0, a);
    int rank = std::atoi(line.substr(a + 1, b - a - 1).c_str());
    if (rank == rank_ || g_failed_here.count(tag)) continue;
    return str_cat("rank ", rank, " failed in ", tag, ": ", line.substr(b + 1));
  }
  return std::nullopt;
}

}  // namespace dtrain::comm
