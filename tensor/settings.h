// DTensor's settings: read once from the environment (core/env, so `1`/`true` and bad values behave as every
// other variable does), changeable by a program or a test. Thread-safe.
//
//   variable                    field          meaning
//   DTRAIN_DTENSOR_STRICT       strict         an op without a sharding rule is an error instead of a
//                                              gather; plain tensors meeting DTensors are checked equal
//                                              across ranks
//   DTRAIN_DTENSOR_CHECK        check          every op's decision (rule, placements, plan) is compared
//                                              across ranks, and plain tensors are checked equal; a
//                                              difference fails on every rank, naming the op and the ranks
//   DTRAIN_COMM_PROFILE         comm_profile   the alpha-beta profile DTensor plans with (dtrain bench comm
//                                              --profile); empty: built-in defaults
//   DTRAIN_DTENSOR_CACHE_MB     cache_bytes    the bound on redistributed copies kept for reuse (0: none)
#pragma once

#include <cstdint>
#include <string>

namespace dtrain::tensor {

struct DTensorSettings {
  bool strict = false;
  bool check = false;
  std::string comm_profile;
  int64_t cache_bytes = int64_t{64} << 20;
};

// The settings in force: from the environment at the first call (ValueError naming a bad variable).
DTensorSettings settings();
// Replaces them (e.g. a test switching check mode on); takes effect for the next op.
void set_settings(const DTensorSettings& s);
// What hot paths read, without copying the settings: the two flags every op reads, the cache bound, and a
// number that changes whenever the settings do (so a cache of something derived from them knows when to
// look again).
bool strict_mode();
bool check_mode();
int64_t cache_bytes();
uint64_t settings_generation();

}  // namespace dtrain::tensor
