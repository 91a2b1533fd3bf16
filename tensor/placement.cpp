// Placement; see placement.h.
#include "tensor/placement.h"

#include <tuple>

#include "core/error.h"

namespace dtrain::tensor {

std::string Placement::to_string() const {
  switch (kind) {
    case Kind::kShard:
      return str_cat("S(", dim, ")");
    case Kind::kReplicate:
      return "R";
    case Kind::kPartial:
      return str_cat("P(", comm::to_string(op), ")");
  }
  return "?";
}

bool operator<(const Placement& a, const Placement& b) {
  auto key = [](const Placement& p) {
    return std::make_tuple(static_cast<int>(p.kind), p.is_shard() ? p.dim : -1,
                           p.is_partial() ? static_cast<int>(p.op) : -1);
  };
  return key(a) < key(b);
}

Placement Shard(int dim) { return Placement{Placement::Kind::kShard, dim, ReduceOp::kSum}; }
Placement Replicate() { return Placement{Placement::Kind::kReplicate, -1, ReduceOp::kSum}; }
Placement Partial(ReduceOp op) { return Placement{Placement::Kind::kPartial, -1, op}; }

std::string to_string(const Placements& placements) {
  std::string s = "(";
  for (size_t i = 0; i < placements.size(); ++i) s += str_cat(i ? ", " : "", placements[i].to_string());
  return s + ")";
}

namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

}  // namespace

Placement parse_placement(const std::string& text) {
  const std::string t = trim(text);
  auto bad = [&]() {
    return ValueError(str_cat("placement \"", t,
                              "\" is not one of S(dim), R, P(sum|avg|max|min) (or Shard(dim), Replicate(), "
                              "Partial(op)). Write e.g. S(0)."));
  };
  auto arg = [&](size_t open) {
    if (t.size() < open + 2 || t[open] != '(' || t.back() != ')') throw bad();
    return trim(t.substr(open + 1, t.size() - open - 2));
  };
  if (t == "R" || t == "Replicate()" || t == "Replicate") return Replicate();
  if (t == "P" || t == "Partial" || t == "Partial()") return Partial();
  if (t.rfind("S(", 0) == 0 || t.rfind("Shard(", 0) == 0) {
    std::string d = arg(t[1] == '(' ? 1 : 5);
    try {
      size_t used = 0;
      int dim = std::stoi(d, &used);
      if (used == d.size()) return Shard(dim);
    } catch (const std::exception&) {
    }
    throw bad();
  }
  if (t.rfind("P(", 0) == 0 || t.rfind("Partial(", 0) == 0) {
    std::string op = arg(t[1] == '(' ? 1 : 7);
    if (op == "sum") return Partial(ReduceOp::kSum);
    if (op == "avg") return Partial(ReduceOp::kAvg);
    if (op == "max") return Partial(ReduceOp::kMax);
    if (op == "min") return Partial(ReduceOp::kMin);
  }
  throw bad();
}

Placements parse_placements(const std::string& text) {
  std::string t = trim(text);
  // Outer parentheses of a tuple "(S(0), R)" (but not of a lone "S(0)").
  if (t.size() >= 2 && t.front() == '(' && t.back() == ')') t = t.substr(1, t.size() - 2);
  Placements out;
  int depth = 0;
  std::string part;
  for (char ch : t + ",") {
    if (ch == '(') ++depth;
    if (ch == ')') --depth;
    if (ch == ',' && depth == 0) {
      out.push_back(parse_placement(part));
      part.clear();
    } else {
      part += ch;
    }
  }
  if (depth != 0 || !part.empty() || out.empty()) {
    throw ValueError(str_cat("placements \"", text,
                             "\" are not a comma-separated list of S(dim), R, P(op) with balanced "
                             "parentheses. Write e.g. \"S(0), R\"."));
  }
  return out;
}

std::vector<Placements> all_placements(const std::vector<Placement>& options, int axes) {
  std::vector<Placements> all{{}};
  for (int a = 0; a < axes; ++a) {
    std::vector<Placements> next;
    for (const auto& p : all) {
      for (const auto& o : options) {
        next.push_back(p);
        next.back().push_back(o);
      }
    }
    all = std::move(next);
  }
  return all;
}

}  // namespace dtrain::tensor
