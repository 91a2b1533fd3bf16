// Re-prints a child's output stream line by line with a prefix ("[rank 3] "), so that lines of different
// ranks never mix. Internal to the launcher. Not thread-safe: one launcher thread owns it.
#pragma once

#include <cstddef>
#include <string>

namespace dtrain::launch::detail {

class LineRelay {
 public:
  // Writes to `out_fd` (not owned). A line longer than `max_line` bytes is written in pieces of that size.
  LineRelay(std::string prefix, int out_fd, std::size_t max_line = 64 * 1024);

  // Appends bytes read from the child and writes every complete line. On a terminal, a segment that ends in
  // '\r' (a progress bar redrawn in place) is shown in place, without a newline, until the next line.
  void feed(const char* data, std::size_t n);
  // Writes a partial last line (with a newline added); called at end of stream.
  void flush();

 private:
  void write_line(const char* data, std::size_t n);

  std::string prefix_;
  int out_fd_;
  std::size_t max_line_;
  std::string pending_;  // bytes after the last newline
  bool tty_;             // out_fd is a terminal: a segment ending in '\r' is a status line, shown in place
  bool status_shown_ = false;
};

// Writes all of `s` to `fd`, retrying on EINTR and partial writes; gives up silently when the fd is broken (a
// closed terminal must not stop the launcher from stopping its ranks).
void write_all(int fd, const std::string& s);

}  // namespace dtrain::launch::detail
