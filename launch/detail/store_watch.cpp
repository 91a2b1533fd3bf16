// StoreWatch; see store_watch.h.
#include "launch/detail/store_watch.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace dtrain::launch::detail {

namespace {

enum class Probe { kAccepted, kRefused, kUnknown };

// One non-blocking connect to host:port, waiting up to 300 ms; an address that does not resolve, a timeout or
// any other error is kUnknown (the watch concludes nothing from it).
Probe probe(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || res == nullptr) {
    return Probe::kUnknown;
  }
  Probe out = Probe::kUnknown;
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
    if (rc == 0) {
      out = Probe::kAccepted;
    } else if (errno == ECONNREFUSED) {
      out = Probe::kRefused;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 300) == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        out = err == 0 ? Probe::kAccepted : err == ECONNREFUSED ? Probe::kRefused : Probe::kUnknown;
      }
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

}  // namespace

bool StoreWatch::gone() {
  if (Clock::now() < next_) return false;
  next_ = Clock::now() + kInterval;
  const Probe p = probe(host_, port_);
  if (p == Probe::kAccepted) answered_ = true;
  return answered_ && p == Probe::kRefused;
}

int StoreWatch::due_in_ms() const {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(next_ - Clock::now()).count();
  return static_cast<int>(std::max<long>(0, left));
}

}  // namespace dtrain::launch::detail
