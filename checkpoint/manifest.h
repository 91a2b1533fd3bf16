// A checkpoint's manifest (DESIGN §6): the format version, the step, the layout it was saved under, every
// tensor's global shape, dtype and placement, which file and byte range holds each block of it and which
// elements those are (a Region), and each shard file's size and CRC-32 per 1 MiB chunk. manifest.json in the
// step's folder.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/region.h"

namespace dtrain::checkpoint {

// A region's box and range as the manifest writes them ({box_offset, box_sizes, begin, count}; the shape is
// the tensor's).
nlohmann::json region_json(const Region& r);

struct BlockRef {
  int64_t file = 0;    // index into Manifest::files
  int64_t offset = 0;  // bytes into the file's data (after its safetensors header)
  Region region;
};

struct TensorInfo {
  std::string dtype;  // safetensors' name
  std::vector<int64_t> shape;
  std::string placement;  // in words, as the saving layout held it
  std::vector<BlockRef> blocks;
};

struct FileInfo {
  std::string name;  // in the step's folder
  int64_t bytes = 0;
  int64_t data_offset = 0;      // where the data starts (8 + the header's length)
  std::vector<uint32_t> crc32;  // per kChunkBytes of the data (none: unchecked, an imported file)
  int64_t header_crc32 = -1;    // of the bytes before the data (-1: unchecked)
};

struct Manifest {
  static constexpr int64_t kVersion = 1;
  int64_t version = kVersion;
  int64_t step = 0;
  int64_t world_size = 0;
  nlohmann::json layout = nlohmann::json::object();  // strategy, tp, mesh, precision
  nlohmann::json meta = nlohmann::json::object();    // the trainer's: optimizer, scaler, data position
  std::vector<FileInfo> files;
  std::map<std::string, TensorInfo> tensors;

  std::string to_json() const;
  // Parses and checks everything a loader relies on, each failure a ValueError naming `path`, the tensor or
  // file, and what is wrong: the format and version (a newer one is refused), the types of all fields, every
  // block's region inside its tensor and its bytes inside its file, and the blocks of each tensor covering
  // every element exactly once.
  static Manifest parse(const std::string& path, const std::string& text);
};

}  // namespace dtrain::checkpoint
