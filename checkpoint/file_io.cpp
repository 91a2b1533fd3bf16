// File operations; see file_io.h.
#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace dtrain::checkpoint {

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw ValueError(str_cat("checkpoint: cannot ", what, " ", path, ": ", std::strerror(errno), "."));
}

}  // namespace

File::File(const std::string& path, Mode mode) : path_(path) {
  fd_ = mode == Mode::kRead ? ::open(path.c_str(), O_RDONLY | O_CLOEXEC)
                            : ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd_ < 0) fail(mode == Mode::kRead ? "open" : "create", path);
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

void File::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, std::min<size_t>(bytes, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write", path_);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void File::read_at(int64_t offset, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, std::min<size_t>(bytes, size_t{1} << 30), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("read", path_);
    if (n == 0) {
      throw ValueError(str_cat("checkpoint: ", path_, " ends at byte ", offset, ", ", bytes,
                               " bytes short of what its header or the manifest says it holds: the file is "
                               "truncated. Load an earlier checkpoint, or save this one again."));
    }
    p += n;
    offset += n;
    bytes -= static_cast<size_t>(n);
  }
}

int64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail("stat", path_);
  return static_cast<int64_t>(st.st_size);
}

void File::sync() {
  if (::fsync(fd_) != 0) fail("sync", path_);
}

void File::close() {
  if (fd_ >= 0 && ::close(fd_) != 0) {
    fd_ = -1;
    fail("close", path_);
  }
  fd_ = -1;
}

uint32_t crc32_of(const void* data, size_t bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const Bytef* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {
    const uInt n = static_cast<uInt>(std::min<size_t>(bytes, size_t{1} << 30));
    crc = ::crc32(crc, p, n);
    p += n;
    bytes -= n;
  }
  return static_cast<uint32_t>(crc);
}

void ChunkChecksums::add(const void* data, size_t bytes) {
  const Bytef* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {
    const size_t n = std::min<size_t>(bytes, static_cast<size_t>(kChunkBytes - in_chunk_));
    crc_ = static_cast<uint32_t>(::crc32(crc_, p, static_cast<uInt>(n)));
    p += n;
    bytes -= n;
    in_chunk_ += static_cast<int64_t>(n);
    if (in_chunk_ == kChunkBytes) {
      done_.push_back(crc_);
      crc_ = 0;
      in_chunk_ = 0;
    }
  }
}

std::vector<uint32_t> ChunkChecksums::finish() {
  if (in_chunk_ > 0) done_.push_back(crc_);
  crc_ = 0;
  in_chunk_ = 0;
  return std::move(done_);
}

void sync_dir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open the folder", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("sync the folder", path);
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = str_cat(path, ".tmp.", ::getpid());
  {
    File f(tmp, File::Mode::kCreate);
    f.write(text.data(), text.size());
    f.sync();
    f.close();
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail(str_cat("rename ", tmp, " to"), path);
  const auto slash = path.rfind('/');
  sync_dir(slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash));
}

std::string read_small_file(const std::string& path, int64_t max_bytes) {
  File f(path, File::Mode::kRead);
  const int64_t n = f.size();
  if (n > max_bytes) {
    throw ValueError(str_cat("checkpoint: ", path, " is ", n, " bytes, more than the ", max_bytes,
                             " such a file may have: it is not a checkpoint's file."));
  }
  std::string s(static_cast<size_t>(n), '\0');
  f.read_at(0, s.data(), s.size());
  return s;
}

}  // namespace dtrain::checkpoint
