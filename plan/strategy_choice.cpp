// The strategy `auto` picks; see strategy_choice.h.
#include "plan/strategy_choice.h"

#include "core/error.h"
#include "plan/memory_model.h"

namespace dtrain::plan {

StrategyChoice choose_strategy(const StrategyInputs& in) {
  if (in.params < 1 || in.tp < 1 || in.data_parallel < 1 || in.ranks_on_node < 1 ||
      !(in.available_bytes > 0)) {
    throw ValueError(str_cat(
        "strategy auto: parameters ", in.params, ", tp ", in.tp, ", data-parallel ranks ", in.data_parallel,
        ", ranks on the node ", in.ranks_on_node, " and available memory ", in.available_bytes,
        " bytes must all be positive (the memory is /proc/meminfo's MemAvailable). Name a "
        "strategy instead: --strategy dp, zero2 or zero3."));
  }
  const double budget = in.available_bytes / static_cast<double>(in.ranks_on_node) / 2;
  const double p = static_cast<double>(in.params) / static_cast<double>(in.tp);
  const double n = static_cast<double>(in.data_parallel);
  auto bytes = [&](parallel::Strategy s) { return model_state_bytes_per_param(s, n) * p; };
  StrategyChoice c;
  for (parallel::Strategy s :
       {parallel::Strategy::kDataParallel, parallel::Strategy::kZero2, parallel::Strategy::kZero3}) {
    c.strategy = s;
    if (bytes(s) <= budget) break;  // (zero3 when nothing fits: the least memory there is)
  }
  const double mib = 1 << 20;
  c.reason = str_cat(parallel::to_string(c.strategy), " (model state: dp ",
                     bytes(parallel::Strategy::kDataParallel) / mib, " MiB, zero2 ",
                     bytes(parallel::Strategy::kZero2) / mib, " MiB, zero3 ",
                     bytes(parallel::Strategy::kZero3) / mib, " MiB per rank, against half of the ",
                     budget * 2 / mib, " MiB available per rank)");
  return c;
}

}  // namespace dtrain::plan
