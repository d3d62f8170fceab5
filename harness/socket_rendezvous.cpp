#include "harness/socket_rendezvous.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace comet::testing {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("socket rendezvous: " + what); }

std::string errno_text() { return std::strerror(errno); }

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Waits until `fd` is ready for `events` or the deadline passes (then throws).
void wait_ready(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) fail(std::string("timed out in ") + what);
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (n < 0 && errno != EINTR) fail(std::string("poll failed in ") + what + ": " + errno_text());
    if (n > 0) {
      if (p.revents & (events | POLLHUP | POLLERR)) return;  // the read/write then tells what happened
    }
  }
}

void send_all(int fd, const void* data, size_t bytes, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    wait_ready(fd, POLLOUT, deadline, "send");
    // MSG_NOSIGNAL: a peer that died gives EPIPE here instead of killing us with SIGPIPE.
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      fail("send failed (peer gone?): " + errno_text());
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void recv_all(int fd, void* data, size_t bytes, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    wait_ready(fd, POLLIN, deadline, "recv");
    const ssize_t n = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (n == 0) fail("peer closed the connection");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      fail("recv failed: " + errno_text());
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

sockaddr_un socket_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    fail("socket path must be 1.." + std::to_string(sizeof(addr.sun_path) - 1) + " characters: '" + path + "'");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

SocketRendezvous::SocketRendezvous(std::string path, int rank, int world, double timeout_s)
    : path_(std::move(path)), rank_(rank), world_(world), timeout_s_(timeout_s) {
  if (world < 1 || rank < 0 || rank >= world)
    fail("rank " + std::to_string(rank) + " / world " + std::to_string(world) + " out of range");
  if (!(timeout_s > 0)) fail("timeout must be positive");
  try {
    if (rank_ == 0) {
      connect_as_root();
    } else {
      connect_as_peer();
    }
  } catch (...) {
    close_all();
    throw;
  }
}

SocketRendezvous::~SocketRendezvous() { close_all(); }

void SocketRendezvous::connect_as_root() {
  fds_.assign(world_, -1);
  if (world_ == 1) return;
  const sockaddr_un addr = socket_address(path_);
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) fail("socket: " + errno_text());
  ::unlink(path_.c_str());  // a file left by an earlier run would make bind fail
  if (::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0)
    fail("bind " + path_ + ": " + errno_text());
  if (::listen(listen_fd_, world_) != 0) fail("listen: " + errno_text());

  const auto deadline = deadline_after(timeout_s_);
  for (int accepted = 1; accepted < world_; ++accepted) {
    wait_ready(listen_fd_, POLLIN, deadline, "accept (are all ranks started?)");
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN) {
        --accepted;
        continue;
      }
      fail("accept: " + errno_text());
    }
    int32_t peer = -1;
    try {
      recv_all(fd, &peer, sizeof(peer), deadline);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (peer <= 0 || peer >= world_ || fds_[peer] >= 0) {
      ::close(fd);
      fail("unexpected hello from rank " + std::to_string(peer));
    }
    fds_[peer] = fd;
  }
  // Everyone is connected: the name is no longer needed.
  ::close(listen_fd_);
  listen_fd_ = -1;
  ::unlink(path_.c_str());
}

void SocketRendezvous::connect_as_peer() {
  fds_.assign(1, -1);
  const sockaddr_un addr = socket_address(path_);
  const auto deadline = deadline_after(timeout_s_);
  for (;;) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail("socket: " + errno_text());
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      fds_[0] = fd;
      break;
    }
    const int err = errno;
    ::close(fd);
    // Rank 0 may not be listening yet: retry until the deadline.
    if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN && err != EINTR)
      fail("connect " + path_ + ": " + std::strerror(err));
    if (Clock::now() > deadline) fail("timed out connecting to rank 0 at " + path_);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int32_t me = rank_;
  send_all(fds_[0], &me, sizeof(me), deadline);
}

void SocketRendezvous::all_gather(const void* mine, void* all, size_t bytes) {
  const auto deadline = deadline_after(timeout_s_);
  char* out = static_cast<char*>(all);
  const uint64_t size = bytes;
  if (rank_ == 0) {
    std::memcpy(out, mine, bytes);
    for (int r = 1; r < world_; ++r) {
      uint64_t theirs = 0;
      recv_all(fds_[r], &theirs, sizeof(theirs), deadline);
      if (theirs != size)
        fail("all_gather size mismatch: rank " + std::to_string(r) + " sent " + std::to_string(theirs) +
             " bytes, rank 0 " + std::to_string(size));
      recv_all(fds_[r], out + static_cast<size_t>(r) * bytes, bytes, deadline);
    }
    for (int r = 1; r < world_; ++r) send_all(fds_[r], out, static_cast<size_t>(world_) * bytes, deadline);
  } else {
    send_all(fds_[0], &size, sizeof(size), deadline);
    send_all(fds_[0], mine, bytes, deadline);
    recv_all(fds_[0], out, static_cast<size_t>(world_) * bytes, deadline);
  }
}

void SocketRendezvous::barrier() {
  const char token = 1;
  std::vector<char> all(world_);
  all_gather(&token, all.data(), 1);
}

AllGatherFn SocketRendezvous::all_gather_fn() {
  return [this](const void* mine, void* all, size_t bytes) { all_gather(mine, all, bytes); };
}

void SocketRendezvous::close_all() noexcept {
  for (int& fd : fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
    ::unlink(path_.c_str());
  }
}

}  // namespace comet::testing
