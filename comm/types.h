// Reduction operators and one options struct per collective (STYLE "Interfaces"). Every collective carries a
// timeout; an unset timeout means the backend's default (DTRAIN_TIMEOUT, else 300 s).
#pragma once

#include <chrono>
#include <optional>

namespace dtrain::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* to_string(ReduceOp op);

using Timeout = std::optional<std::chrono::milliseconds>;

struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  Timeout timeout;
};

struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  Timeout timeout;
};

struct AllGatherOptions {
  Timeout timeout;
};

struct BroadcastOptions {
  int root = 0;  // group rank that holds the data
  Timeout timeout;
};

struct AllToAllOptions {
  Timeout timeout;
};

struct SendOptions {
  int tag = 0;
  Timeout timeout;
};

struct RecvOptions {
  int tag = 0;
  Timeout timeout;
};

struct BarrierOptions {
  Timeout timeout;
};

}  // namespace dtrain::comm
