// Line-by-line relaying of child output; see line_relay.h.
#include "launch/detail/line_relay.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dtrain::launch::detail {

void write_all(int fd, const std::string& s) {
  const char* p = s.data();
  std::size_t left = s.size();
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w > 0) {
      p += w;
      left -= static_cast<std::size_t>(w);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && errno == EAGAIN) {
      pollfd pfd{fd, POLLOUT, 0};
      ::poll(&pfd, 1, -1);  // a non-blocking stdout we inherited: wait until it drains
    } else {
      return;
    }
  }
}

LineRelay::LineRelay(std::string prefix, int out_fd, std::size_t max_line)
    : prefix_(std::move(prefix)), out_fd_(out_fd), max_line_(max_line), tty_(::isatty(out_fd) == 1) {}

void LineRelay::feed(const char* data, std::size_t n) {
  pending_.append(data, n);
  std::size_t start = 0;
  while (true) {
    const std::size_t nl = tty_ ? pending_.find_first_of("\n\r", start) : pending_.find('\n', start);
    if (nl == std::string::npos) break;
    if (pending_[nl] == '\r') {  // a status line: drawn over the previous one, no newline
      if (nl > start) {
        std::string status = "\r\033[K";
        status.append(prefix_).append(pending_.data() + start, nl - start);
        write_all(out_fd_, status);
        status_shown_ = true;
      }
    } else {
      write_line(pending_.data() + start, nl - start);
    }
    start = nl + 1;
  }
  while (pending_.size() - start >= max_line_) {
    write_line(pending_.data() + start, max_line_);
    start += max_line_;
  }
  pending_.erase(0, start);
}

void LineRelay::flush() {
  if (!pending_.empty()) write_line(pending_.data(), pending_.size());
  pending_.clear();
}

void LineRelay::write_line(const char* data, std::size_t n) {
  // One write per line keeps each line whole even when the launcher's stdout is shared.
  std::string line;
  line.reserve(prefix_.size() + n + 4);
  if (status_shown_) line.append("\r\033[K");  // the status line gives way to the line
  status_shown_ = false;
  line.append(prefix_).append(data, n).push_back('\n');
  write_all(out_fd_, line);
}

}  // namespace dtrain::launch::detail
