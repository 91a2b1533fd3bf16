// The strategies' names, one table for the command line, the config file and the docs (docs/architecture.md,
// "Strategies"): what `--strategy` accepts, with the names users bring from DDP, Horovod, DeepSpeed and FSDP.
#pragma once

#include <string>
#include <vector>

namespace dtrain::parallel {

enum class Strategy {
  kDataParallel,  // dp: Horovod-style data parallel (DDP, horovod)
  kZero1,         // optimizer state sharded (DeepSpeed stage 1)
  kZero2,         // + gradients reduce-scattered (stage 2; FSDP SHARD_GRAD_OP)
  kZero3,         // + parameters sharded (stage 3; FSDP FULL_SHARD)
  kHybridShard,   // hsdp: ZeRO-3 within groups, replicated across them (HSDP, ZeRO++ hpZ)
};

// "dp", "zero1", ...: the canonical name.
const char* to_string(Strategy s);

// Accepts the canonical names and the aliases of the table (case-insensitive): dp, ddp, horovod; zero1..3,
// deepspeed1..3 ("deepspeed" alone needs a stage), shard_grad_op (2), full_shard and fsdp (3); hsdp,
// hybrid_shard. ValueError listing the names otherwise.
Strategy parse_strategy(const std::string& name);

// Every canonical name, in table order.
std::vector<std::string> strategy_names();

// The orders that lay tp's (or hsdp's shard) groups strided across hosts, the other axis inside one, in the
// comma-separated form of `dtrain train --mesh-order` (parallel/parallelize.h, ParallelConfig::mesh_order).
inline constexpr char kTpGroupsStrided[] = "tp,dp";
inline constexpr char kShardGroupsStrided[] = "shard,replicate";
// "tp,dp" as {"tp", "dp"}; "" as none (the default order).
std::vector<std::string> parse_mesh_order(const std::string& text);
// Whether a comma-separated order puts tp (or hsdp's shard axis) outermost, its groups strided across hosts.
// "" and the default orders: false.
bool groups_strided(const std::string& text);

}  // namespace dtrain::parallel
