#pragma once
// Rendezvous: how the ranks of a multi-process job find each other.
//
// Rank 0 ("host0") runs a small TCP store; every other rank connects to it
// and sends {rank, world size, job token, plan hash, blob}, where the blob is
// whatever the transport needs to reach the rank (for UCX: its worker
// address). Rank 0 checks that everyone agrees on the world size, the job
// token and the model plan (and that no rank is missing, duplicated or out of
// range), then answers every rank with all blobs in rank order — or with one
// error message that every rank throws as redco::Error, so a misconfigured
// job stops everywhere with the same explanation instead of hanging.
//
//   Rendezvous rz({.rank = r, .world_size = n, .host0 = "10.0.0.1", .port = 29500,
//                  .job_token = "job-42", .plan_hash = plan.hash()});
//   std::vector<std::string> blobs = rz.exchange(my_address);
//
// Rank 0 binds only `host0` (never every interface), in the constructor, so
// port 0 gives an ephemeral port that port() reports. Other ranks connect
// with retries and backoff until the timeout, so start order does not matter.
// Messages are length-prefixed and every read and write has a deadline.
// This file uses plain POSIX sockets: it does not depend on any transport.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace redco::comm {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct RendezvousOptions {
  int rank = 0;
  int world_size = 1;
  std::string host0 = "127.0.0.1";             // where rank 0 listens (a name or an address)
  int port = 29500;                            // 0 on rank 0: any free port, see port()
  std::string job_token;                       // ranks of one job share it; guards against strays
  uint64_t plan_hash = 0;                      // a digest of the model plan every rank must share
  std::chrono::milliseconds timeout{180'000};  // for the whole exchange
};

class Rendezvous {
 public:
  explicit Rendezvous(RendezvousOptions options);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // Rank 0: the port it listens on. Other ranks: the port they connect to.
  int port() const { return port_; }
  const RendezvousOptions& options() const { return options_; }

  // Sends this rank's blob and returns every rank's, indexed by rank. Throws
  // redco::Error when the ranks disagree, rank 0 cannot be reached, or the
  // timeout passes. Call once.
  std::vector<std::string> exchange(const std::string& blob);

 private:
  std::vector<std::string> serve(const std::string& blob);
  std::vector<std::string> join(const std::string& blob);

  RendezvousOptions options_;
  int listen_fd_ = -1;  // rank 0 only
  int port_ = 0;
};

}  // namespace redco::comm
