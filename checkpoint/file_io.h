// The file operations a checkpoint is made of, each failure a ValueError naming the file and the system's
// reason: whole writes and positioned reads that retry short transfers, fsync of files and folders, a small
// file replaced atomically, and CRC-32 checksums of fixed-size chunks (zlib's values, libdeflate's speed), so
// that a reader of part of a file can check what it read. Thread-safety: a File's reads (read_at,
// read_scattered) may run on several threads at once; anything else is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::checkpoint {

// Checksummed chunks of a shard file's data (the part after the safetensors header): 1 MiB each, the last one
// shorter. A read of any byte range is checked by reading the chunks that cover it.
constexpr int64_t kChunkBytes = int64_t{1} << 20;

class File {
 public:
  enum class Mode { kRead, kCreate };  // kCreate: a new file, truncated, mode 0600
  File(const std::string& path, Mode mode);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  void write(const void* data, size_t bytes);              // appends all of it
  void read_at(int64_t offset, void* data, size_t bytes);  // all of it, or ValueError ("ends at byte N")
  // The file's bytes from `offset` on, in order, into the pieces (preadv): all of them, or as read_at.
  struct Piece {
    char* data;
    size_t bytes;
  };
  void read_scattered(int64_t offset, std::vector<Piece> pieces);
  int64_t size() const;
  void sync();             // fsync
  void start_writeback();  // of what was written since the last call, without waiting (sync_file_range)
  void close();
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t written_ = 0, kicked_ = 0;
};

// Running CRC-32 of fixed-size chunks of a byte stream.
class ChunkChecksums {
 public:
  void add(const void* data, size_t bytes);
  std::vector<uint32_t> finish();  // one per chunk begun

 private:
  std::vector<uint32_t> done_;
  uint32_t crc_ = 0;
  int64_t in_chunk_ = 0;
};
uint32_t crc32_of(const void* data, size_t bytes);
// The CRC-32 of the bytes a CRC `crc` was of followed by `data` (crc32_of(x + y) == crc32_extend(crc32_of(x),
// y)).
uint32_t crc32_extend(uint32_t crc, const void* data, size_t bytes);

// fsync of a folder (a rename in it, or a file created in it, is then durable).
void sync_dir(const std::string& path);
// Writes `text` to `path` through a temporary file beside it, synced, then renamed over it: readers see the
// old or the new content, never a part.
void write_file_atomic(const std::string& path, const std::string& text);
std::string read_small_file(const std::string& path, int64_t max_bytes);

}  // namespace dtrain::checkpoint
