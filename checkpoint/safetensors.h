// The safetensors layout (Hugging Face's format, which Python's `safetensors` and PyTorch load): 8 bytes of
// little-endian header length N, N bytes of JSON naming each tensor's dtype, shape and byte range
// [begin, end) in the data that follows, then the data, every byte of it some tensor's. Shard files and
// exports are both written in it. libtorch-free: dtypes are safetensors' names ("F32", "BF16", ...).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain::checkpoint {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // bytes into the data
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  int64_t data_offset = 0;  // bytes from the file's start to the data
  int64_t data_bytes = 0;
  const SafetensorsEntry* find(const std::string& name) const;
};

// Bytes per element of a safetensors dtype; ValueError naming it otherwise.
int64_t dtype_bytes(const std::string& dtype);

// The header for `tensors` (their ranges must follow one another from 0, as the format requires) and
// `metadata`, length prefix included, padded with spaces so that the data starts at a multiple of 8 bytes.
std::string encode_header(const std::vector<SafetensorsEntry>& tensors,
                          const std::map<std::string, std::string>& metadata);

// Parses the header of the file `path` of `file_bytes` bytes whose first bytes are `head` (at least 8; more
// read through `read_more` as needed). Every check safetensors makes, each a ValueError naming the file and
// the entry: the length (at most 100 MB, inside the file), JSON, known dtypes, shape x dtype size = the
// range, the ranges in order without holes or overlap, and the data ending exactly at the file's end.
SafetensorsHeader decode_header(const std::string& path, const std::string& header_json, int64_t header_len,
                                int64_t file_bytes);
// Reads and decodes the header of the file at `path`.
SafetensorsHeader read_header(const std::string& path);

}  // namespace dtrain::checkpoint
