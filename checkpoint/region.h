// Which elements of a global tensor a block of a checkpoint holds, and the arithmetic that maps blocks saved
// under one layout onto the pieces another layout needs (DESIGN §6). Pure: no tensors, no I/O.
//
// Every layout dtrain's strategies make is one shape of Region:
//
//   layout                              box (in the global tensor)          range (of the box, row-major)
//   data parallel (replicated)          the whole tensor                    all of it
//   tensor parallel (rows or columns)   this rank's rows or columns         all of it
//   ZeRO (flat shards of a bucket)      the whole tensor                    this rank's run of it
//   ZeRO x tensor parallel              this rank's rows or columns         this rank's run of them
//
// A Region's elements, in the order a block stores them, are a sequence of runs of consecutive global
// (row-major) indices, ascending: so two regions' common elements are found by walking both run lists once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::checkpoint {

struct Region {
  std::vector<int64_t> shape;       // the global tensor's
  std::vector<int64_t> box_offset;  // the box's first index per dim
  std::vector<int64_t> box_sizes;   // the box's extent per dim
  int64_t begin = 0;                // first element of the box held (row-major within the box)
  int64_t count = 0;                // elements held

  // The whole of a tensor of `shape`.
  static Region whole(const std::vector<int64_t>& shape);
  int64_t box_numel() const;
  // ValueError naming `what` when the box leaves the shape or the range leaves the box.
  void validate(const std::string& what) const;
  std::string to_string() const;  // "rows 0..63 of [128, 64], elements 0..4095"
  bool operator==(const Region& o) const = default;
};

// "[4, 3]"
std::string dims_to_string(const std::vector<int64_t>& sizes);

// A run of `length` consecutive global indices starting at `global`, which is the block's elements from
// `local` on.
struct Run {
  int64_t global = 0;
  int64_t local = 0;
  int64_t length = 0;
};

// The region's elements as runs, ascending in both global and local index; adjacent runs merged.
std::vector<Run> runs_of(const Region& r);

// A copy of `length` elements from position `src` of one block to position `dst` of another.
struct Copy {
  int64_t src = 0;
  int64_t dst = 0;
  int64_t length = 0;
};

// The elements `from` and `to` (regions of the same global tensor) have in common, as copies from `from`'s
// local positions to `to`'s; consecutive copies merged. Linear in the two run lists.
std::vector<Copy> overlap(const std::vector<Run>& from, const std::vector<Run>& to);

// Part `index` of `parts` of the region's range, as even as possible (the first count % parts parts one
// more): how the ranks holding the same piece share its writing.
Region split(const Region& r, int64_t parts, int64_t index);

}  // namespace dtrain::checkpoint
