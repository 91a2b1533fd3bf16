// CostModel: the alpha-beta collective cost model, below DTensor's redistribution planner (tensor/) and the
// planner of plan/. Predicted seconds of the steps a redistribution may take, per mesh axis: alpha + beta *
// bytes for each collective (bytes as nccl-tests' bus bytes, per rank), a copy rate for local steps, and a
// weight on the peak buffer a step needs. Built-in defaults serve until a profile measured on the machine in
// use is loaded.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain::comm {

// The kinds of single-axis step a redistribution is made of (DESIGN §4).
enum class StepKind {
  kAllGather,      // S(d) -> R
  kAllReduce,      // P -> R
  kReduceScatter,  // P -> S(d)
  kAllToAll,       // S(i) -> S(j)
  kLocalSlice,     // R -> S(d): keep this rank's rows
  kLocalPartial,   // R -> P(op): sum keeps the value on coordinate 0 and zeros elsewhere; avg/max/min keep it
  kLocalScale,     // P(sum) <-> P(avg): multiply or divide by the axis size
};
const char* to_string(StepKind k);
bool is_collective(StepKind k);

struct AlphaBeta {
  double alpha = 0;  // seconds per call
  double beta = 0;   // seconds per (bus) byte
};

// Least-squares fit of seconds = alpha + beta * bytes over (bytes, seconds) points, each point's relative
// error weighted alike (weights 1 / seconds^2), so that noise at the large sizes does not set the latency;
// alpha and beta are clamped to be non-negative (a noisy sweep can otherwise give a negative intercept).
// ValueError for fewer than two distinct sizes.
AlphaBeta fit_alpha_beta(const std::vector<std::pair<double, double>>& bytes_seconds);

// What `dtrain bench comm --profile FILE` measured: alpha and beta per collective ("all_gather",
// "all_reduce", "reduce_scatter", "all_to_all", ...) on one backend at one number of ranks. Stored as JSON.
struct CommProfile {
  std::string backend;
  int ranks = 0;
  std::map<std::string, AlphaBeta> collectives;
};

// Writes to a temporary file in the same folder, syncs, and renames it over `path`: a reader never sees half
// a file.
void write_profile(const std::string& path, const CommProfile& profile);
// ValueError naming the file and what is wrong (missing, not JSON, wrong format, missing or negative values).
CommProfile read_profile(const std::string& path);

class CostModel {
 public:
  // Defaults for a mesh of `axes` axes, from the figures of DESIGN §8 (loopback TCP, ~1 GB/s bus bandwidth,
  // ~0.2 ms per small collective; local copies at ~10 GB/s).
  static CostModel defaults(int axes);
  // The defaults, with every axis's collectives replaced by the profile's measurements (the profile was
  // measured on one group; each axis of the mesh is assumed to behave like it).
  static CostModel from_profile(const CommProfile& profile, int axes);

  // Seconds for a step on `axis` moving `bytes` (bus bytes for collectives, copied bytes for local steps).
  double seconds(StepKind kind, int axis, double bytes) const;
  // Seconds charged per byte of the largest buffer a step holds (a tie-breaker that prefers smaller peaks).
  double memory_weight() const { return memory_weight_; }

  void set(StepKind kind, int axis, AlphaBeta ab);
  const AlphaBeta& get(StepKind kind, int axis) const;
  int axes() const { return static_cast<int>(per_axis_.size()); }

 private:
  static constexpr int kKinds = 7;
  std::vector<std::array<AlphaBeta, kKinds>> per_axis_;
  double memory_weight_ = 1e-12;
};

}  // namespace dtrain::comm
