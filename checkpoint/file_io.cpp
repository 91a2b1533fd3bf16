// File operations; see file_io.h.
#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <libdeflate.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

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
    written_ += n;
  }
}

void File::start_writeback() {
  if (written_ > kicked_) ::sync_file_range(fd_, kicked_, written_ - kicked_, SYNC_FILE_RANGE_WRITE);
  kicked_ = written_;
}

void File::read_at(int64_t offset, void* data, size_t bytes) {
  read_scattered(offset, {{static_cast<char*>(data), bytes}});
}

void File::read_scattered(int64_t offset, std::vector<Piece> pieces) {
  size_t first = 0;  // pieces before it are read
  std::vector<iovec> iov;
  while (first < pieces.size()) {
    if (pieces[first].bytes == 0) {
      ++first;
      continue;
    }
    iov.clear();
    size_t want = 0;
    for (size_t k = first; k < pieces.size() && iov.size() < IOV_MAX && want < (size_t{1} << 30); ++k) {
      iov.push_back({pieces[k].data, pieces[k].bytes});
      want += pieces[k].bytes;
    }
    const ssize_t n = ::preadv(fd_, iov.data(), static_cast<int>(iov.size()), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("read", path_);
    if (n == 0) {
      size_t short_by = 0;
      for (size_t k = first; k < pieces.size(); ++k) short_by += pieces[k].bytes;
      throw ValueError(str_cat("checkpoint: ", path_, " ends at byte ", offset, ", ", short_by,
                               " bytes short of what its header or the manifest says it holds: the file is "
                               "truncated. Load an earlier checkpoint, or save this one again."));
    }
    offset += n;
    for (size_t left = static_cast<size_t>(n);
         left > 0;) {  // past what was read; a piece read in part shrinks
      const size_t take = std::min(left, pieces[first].bytes);
      pieces[first].data += take;
      pieces[first].bytes -= take;
      left -= take;
      if (pieces[first].bytes == 0) ++first;
    }
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

uint32_t crc32_of(const void* data, size_t bytes) { return ::libdeflate_crc32(0, data, bytes); }

uint32_t crc32_extend(uint32_t crc, const void* data, size_t bytes) {
  return ::libdeflate_crc32(crc, data, bytes);
}

void ChunkChecksums::add(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const size_t n = std::min<size_t>(bytes, static_cast<size_t>(kChunkBytes - in_chunk_));
    crc_ = ::libdeflate_crc32(crc_, p, n);
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
