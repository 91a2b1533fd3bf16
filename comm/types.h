// Reduction operators and one options struct per collective (STYLE "Interfaces"). Every collective carries a
// timeout; an unset timeout means the backend's default (DTRAIN_TIMEOUT, else 300 s).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace dtrain::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* to_string(ReduceOp op);

using Timeout = std::optional<std::chrono::milliseconds>;

// A run of collectives issued together in a fixed pattern (a strategy's gradient buckets) whose agreement is
// checked once: the first collective of the run carries `fingerprint` (of the whole run: every member's
// size, dtype and op, as the caller computes it) in its agreement exchange; the others skip the exchange. A
// rank that issues another run, or none, is named at the first collective as any disagreement is; one that
// diverges later in the run is named by the timeout. fingerprint 0: no run, each collective checks itself.
struct AgreementRun {
  uint64_t fingerprint = 0;
  bool first = true;
};

struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  Timeout timeout;
  AgreementRun run;
};

struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  Timeout timeout;
  AgreementRun run;
  // The caller has no further use for the input's values: an engine may reduce in it, in place, instead of
  // in a temporary copy. Gloo does (an all-reduce in the input, then this rank's chunk copied out); its own
  // reduce-scatter holds a copy of the whole input, and the uneven form a padded one besides.
  bool input_is_scratch = false;
};

struct AllGatherOptions {
  Timeout timeout;
  AgreementRun run;
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
