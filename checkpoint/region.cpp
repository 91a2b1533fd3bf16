// Region arithmetic; see region.h.
#include "checkpoint/region.h"

#include <algorithm>

#include "core/error.h"

namespace dtrain::checkpoint {

std::string dims_to_string(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += str_cat(i ? ", " : "", v[i]);
  return s + "]";
}

namespace {

int64_t product(const std::vector<int64_t>& v, size_t from = 0) {
  int64_t p = 1;
  for (size_t i = from; i < v.size(); ++i) p *= v[i];
  return p;
}

}  // namespace

Region Region::whole(const std::vector<int64_t>& shape) {
  Region r;
  r.shape = shape;
  r.box_offset.assign(shape.size(), 0);
  r.box_sizes = shape;
  r.count = product(shape);
  return r;
}

int64_t Region::box_numel() const { return product(box_sizes); }

void Region::validate(const std::string& what) const {
  if (box_offset.size() != shape.size() || box_sizes.size() != shape.size()) {
    throw ValueError(str_cat(what, ": the box has ", box_offset.size(), " offsets and ", box_sizes.size(),
                             " sizes for a ", shape.size(), "-d tensor of shape ", dims_to_string(shape),
                             "."));
  }
  constexpr int64_t kMax = int64_t{1} << 48;  // elements: far beyond any tensor, far from overflow
  int64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || shape[i] > kMax || box_offset[i] < 0 || box_sizes[i] < 0 ||
        box_offset[i] > shape[i] - box_sizes[i]) {
      throw ValueError(str_cat(what, ": the box at ", dims_to_string(box_offset), " of sizes ",
                               dims_to_string(box_sizes), " leaves the tensor's shape ",
                               dims_to_string(shape), " on dim ", i, "."));
    }
    numel = shape[i] == 0 ? 0 : std::min(kMax + 1, numel * shape[i]);
  }
  if (numel > kMax)
    throw ValueError(str_cat(what, ": the shape ", dims_to_string(shape), " has more than 2^48 elements."));
  if (begin < 0 || count < 0 || begin > box_numel() - count) {
    throw ValueError(str_cat(what, ": elements ", begin, "..", begin + count, " leave the box of ",
                             box_numel(), " elements (sizes ", dims_to_string(box_sizes), ")."));
  }
}

std::string Region::to_string() const {
  std::string s;
  bool whole_box = true;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (box_sizes[i] == shape[i]) continue;
    whole_box = false;
    s +=
        str_cat(s.empty() ? "" : ", ", "dim ", i, " ", box_offset[i], "..", box_offset[i] + box_sizes[i] - 1);
  }
  s = whole_box ? str_cat("all of ", dims_to_string(shape)) : str_cat(s, " of ", dims_to_string(shape));
  if (begin != 0 || count != box_numel()) s += str_cat(", elements ", begin, "..", begin + count - 1);
  return s;
}

std::vector<Run> runs_of(const Region& r) {
  std::vector<Run> out;
  if (r.count == 0) return out;
  const size_t d = r.shape.size();
  // k: the innermost dim the box does not cover whole (dims after it are whole, so a box row from dim k on
  // is one run of L consecutive global indices)
  size_t k = d;
  while (k > 0 && r.box_sizes[k - 1] == r.shape[k - 1]) --k;
  if (k > 0) --k;
  const int64_t inner = d == 0 ? 1 : product(r.shape, k + 1);
  const int64_t L = d == 0 ? 1 : r.box_sizes[k] * inner;
  std::vector<int64_t> stride(d, 1);
  for (size_t i = d; i-- > 1;) stride[i - 1] = stride[i] * r.shape[i];
  const int64_t end = r.begin + r.count;
  int64_t row = r.begin / L;
  // the outer multi-index (dims 0..k-1) of `row`, as an odometer
  std::vector<int64_t> idx(k, 0);
  for (size_t i = k, rest = static_cast<size_t>(row); i-- > 0;) {
    idx[i] = static_cast<int64_t>(rest) % r.box_sizes[i];
    rest /= static_cast<size_t>(r.box_sizes[i]);
  }
  for (; row * L < end; ++row) {
    int64_t g = d == 0 ? 0 : r.box_offset[k] * inner;
    for (size_t i = 0; i < k; ++i) g += (r.box_offset[i] + idx[i]) * stride[i];
    const int64_t lo = std::max(row * L, r.begin), hi = std::min((row + 1) * L, end);
    const Run run{g + (lo - row * L), lo - r.begin, hi - lo};
    if (!out.empty() && out.back().global + out.back().length == run.global) {
      out.back().length += run.length;
    } else {
      out.push_back(run);
    }
    for (size_t i = k; i-- > 0;) {  // next row
      if (++idx[i] < r.box_sizes[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

std::vector<Copy> overlap(const std::vector<Run>& from, const std::vector<Run>& to) {
  std::vector<Copy> out;
  size_t i = 0, j = 0;
  while (i < from.size() && j < to.size()) {
    const Run& a = from[i];
    const Run& b = to[j];
    const int64_t lo = std::max(a.global, b.global);
    const int64_t hi = std::min(a.global + a.length, b.global + b.length);
    if (hi > lo) {
      const Copy c{a.local + (lo - a.global), b.local + (lo - b.global), hi - lo};
      if (!out.empty() && out.back().src + out.back().length == c.src &&
          out.back().dst + out.back().length == c.dst) {
        out.back().length += c.length;
      } else {
        out.push_back(c);
      }
    }
    if (a.global + a.length <= b.global + b.length) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

Region split(const Region& r, int64_t parts, int64_t index) {
  DTRAIN_ASSERT(parts >= 1 && index >= 0 && index < parts, "parts ", parts, " index ", index);
  Region s = r;
  const int64_t base = r.count / parts, extra = r.count % parts;
  s.begin = r.begin + index * base + std::min(index, extra);
  s.count = base + (index < extra ? 1 : 0);
  return s;
}

}  // namespace dtrain::checkpoint
