// Text as training data: the bytes of a file or of every text file in a folder, one token per byte
// (vocabulary 256), split into a training and a validation part, cut into windows.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace dtrain::train {

struct TextCorpus {
  std::string source;  // what was read, for the log
  at::Tensor train;    // token ids: the bytes (uint8; windows() gives int64)
  at::Tensor val;
};

// Reads `path` (a file, or a folder whose regular files are read in name order, skipping fortune's binary
// .dat/.u8 indexes). The last `val_fraction` of the bytes is the validation part. ValueError naming the path
// when it is missing or holds too little text.
TextCorpus load_text(const std::string& path, double val_fraction = 0.05);

// The windows of `seq + 1` tokens a model of context `seq` trains on: window i is tokens i*seq .. i*seq + seq
// (each window's last token is the next one's first), window_count() of them; ValueError when there is not
// one.
int64_t window_count(const at::Tensor& tokens, int64_t seq);
// The windows `indices` names (int64 [k]): [k, seq + 1] int64.
at::Tensor windows(const at::Tensor& tokens, int64_t seq, const at::Tensor& indices);

}  // namespace dtrain::train
