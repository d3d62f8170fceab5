// A Unix-domain-socket rendezvous for multi-process C++ tests and benchmarks: rank 0 listens on a path, the other
// ranks connect to it, and the star of connections carries an all-gather (the bootstrap IpcTeam
// needs) and a barrier. Every operation is bounded by a deadline: a dead or stuck peer turns into a
// std::runtime_error, never a hang.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "comet/team.hpp"

namespace comet::testing {

class SocketRendezvous {
 public:
  // Collective over `world` processes. Rank 0 binds `path` (replacing a stale socket file) and accepts
  // the others; the others retry connecting until rank 0 is there. Throws after `timeout_s`.
  SocketRendezvous(std::string path, int rank, int world, double timeout_s = 60.0);
  ~SocketRendezvous();
  SocketRendezvous(const SocketRendezvous&) = delete;
  SocketRendezvous& operator=(const SocketRendezvous&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }

  // `all` receives world * bytes, rank-major. Every rank must pass the same `bytes`.
  void all_gather(const void* mine, void* all, size_t bytes);
  // No rank returns before every rank has called it.
  void barrier();
  // all_gather as an AllGatherFn; it refers to *this, which must outlive its use.
  AllGatherFn all_gather_fn();

 private:
  void connect_as_root();
  void connect_as_peer();
  void close_all() noexcept;

  std::string path_;
  int rank_;
  int world_;
  double timeout_s_;
  int listen_fd_ = -1;
  // Rank 0: fds_[r] is the connection to rank r (fds_[0] unused). Others: fds_[0] is the one to rank 0.
  std::vector<int> fds_;
};

}  // namespace comet::testing
