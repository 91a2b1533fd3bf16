// Backend::agree: every rank checks, before the engine is called, that all ranks entered the same collective
// with the same dtype, counts, reduce op and root (see backend.h, "Agreement").
//
// Each rank contributes its OpInfo::signature (kSignatureFields int64) to one all_gather that the engine runs
// on its own thread before the data moves (comm/mpi, comm/gloo); every rank then compares all of them, field
// by field, against the value most ranks hold, so each rank raises the same error naming the ranks that
// differ.
#include <ATen/ATen.h>

#include <atomic>
#include <map>

#include "comm/backend.h"
#include "comm/detail/agreement.h"
#include "core/error.h"

namespace dtrain::comm {

namespace {

const char* const kKinds[] = {"?",         "all_reduce", "reduce_scatter", "all_gather",
                              "broadcast", "all_to_all", "barrier"};

std::string field_value(int field, int64_t v) {
  switch (field) {
    case 0:
      return v >= 0 && v < static_cast<int64_t>(std::size(kKinds)) ? kKinds[v] : str_cat("kind ", v);
    case 1:
      return v < 0 ? "none" : c10::toString(static_cast<at::ScalarType>(v));
    case 2:
      return str_cat(v, " elements");
    case 3:
      return str_cat("counts (or run of collectives) #", static_cast<uint64_t>(v) % 100000);
    case 4:
      return v < 0 ? "none" : to_string(static_cast<ReduceOp>(v));
    case 5:
      return v < 0 ? "none" : str_cat("root ", v);
  }
  return "?";
}

const char* const kFieldNames[] = {"the collective",      "the dtype",     "the element count",
                                   "the per-rank counts", "the reduce op", "the root"};

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += str_cat(i ? ", " : "", ranks[i]);
  return s;
}

std::atomic<bool> g_agreement{true};

}  // namespace

void set_agreement_check(bool on) { g_agreement = on; }
bool agreement_check() { return g_agreement; }

void Backend::sign(OpInfo* info, int64_t kind, const at::Tensor& t, int64_t total, int64_t counts_hash,
                   int64_t op, int64_t root) {
  if (!g_agreement) return;
  info->signature = {kind, t.defined() ? static_cast<int64_t>(t.scalar_type()) : -1, total, counts_hash, op,
                     root};
}

void Backend::sign_in_run(OpInfo* info, const AgreementRun& run, int64_t kind, const at::Tensor& t,
                          int64_t total, int64_t counts_hash, int64_t op, int64_t root) {
  if (run.fingerprint == 0) {
    sign(info, kind, t, total, counts_hash, op, root);
  } else if (run.first) {  // checks the whole run; the rest of it goes unsigned
    sign(info, kind, t, total, static_cast<int64_t>(run.fingerprint >> 1), op, root);
  }
}

void check_signatures(const OpInfo& info, const int64_t* a, const std::vector<int>& global_ranks) {
  const int n = static_cast<int>(global_ranks.size());
  constexpr int kFields = kSignatureFields;
  std::string diff;
  for (int f = 0; f < kFields && diff.empty(); ++f) {
    std::map<int64_t, std::vector<int>> holders;  // value -> global ranks
    for (int g = 0; g < n; ++g) holders[a[g * kFields + f]].push_back(global_ranks[g]);
    if (holders.size() == 1) continue;
    // The value most ranks hold (ties: group rank 0's) is "expected"; the others are named.
    int64_t expected = a[f];
    for (auto& [v, rs] : holders) {
      if (rs.size() > holders[expected].size()) expected = v;
    }
    for (auto& [v, rs] : holders) {
      if (v == expected) continue;
      diff += str_cat(rs.size() == 1 ? "rank " : "ranks ", rank_list(rs), " passed ", field_value(f, v),
                      " where ", holders[expected].size() == 1 ? "rank " : "ranks ",
                      rank_list(holders[expected]), " passed ", field_value(f, expected), "; ");
    }
    diff = str_cat("the ranks disagree on ", kFieldNames[f], ": ", diff);
  }
  if (diff.empty()) return;
  diff.resize(diff.size() - 2);
  throw ValueError(
      str_cat(describe(info), ": ", diff,
              ". Every rank must call the same collectives in the same order with the same dtype, "
              "sizes, op and root; nothing was sent."));
}

}  // namespace dtrain::comm
