// Text as training data: the bytes of a file or of every text file in a folder, one token per byte
// (vocabulary 256), split into a training and a validation part, and batches of windows drawn from them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace dtrain::train {

struct TextCorpus {
  std::string source;  // what was read, for the log
  at::Tensor train;    // int64 token ids (bytes)
  at::Tensor val;
};

// Reads `path` (a file, or a folder whose regular files are read in name order, skipping fortune's binary
// .dat/.u8 indexes). The last `val_fraction` of the bytes is the validation part. ValueError naming the path
// when it is missing or holds too little text.
TextCorpus load_text(const std::string& path, double val_fraction = 0.05);

// `batch` windows of `seq + 1` tokens from `tokens`, their starts drawn from a generator seeded with (seed,
// step): the same on every rank, and different for every step. Returns [batch, seq + 1] int64.
at::Tensor sample_windows(const at::Tensor& tokens, int64_t batch, int64_t seq, uint64_t seed, int64_t step);

}  // namespace dtrain::train
