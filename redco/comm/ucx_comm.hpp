#pragma once
// The UCX backend: one process per rank, messages over UCP tagged send/recv.
// UCX picks the transport per peer itself (UCX_TLS narrows the choice, but
// must leave a transport that detects dead peers, e.g. tcp: "sm,self" alone
// cannot connect). A peer on another host (or in another network namespace)
// gets one endpoint with peer-failure detection: TCP or RDMA. UCX 1.13 has no
// shared-memory transport that detects a dead peer, so a peer on the same
// host gets two endpoints: one for data without error handling (shared
// memory, single-copy CMA for large messages; ~1.5x TCP loopback's
// bandwidth) and an idle TCP one that reports the peer's death.
//
//   auto comm = comm::connect_ucx({.rank = r, .world_size = n, .host0 = "10.0.0.1",
//                                  .port = 29500, .job_token = token,
//                                  .plan_hash = plan_hash});
//   sched::sync_wait(comm->all_reduce(grad, ReduceOp::mean));
//
// Start-up: the ranks exchange UCX worker addresses through a Rendezvous
// (rank 0's TCP store, which also checks that world size, job token and model
// plan agree), then every rank opens endpoints to every other one. One
// ProgressEngine thread drives the UCX worker; completion callbacks only
// record results, and the awaiting coroutines resume on their own threads,
// except that a ring's later steps (and their additions) are posted from the
// completion of the earlier ones, so a large all-reduce runs to the end while
// its caller computes (DataParallel's buckets during backward).
//
// Algorithms, all deterministic (the same inputs give bitwise the same
// output on every rank and in every run), reducing in f32:
//  - all_reduce of at most `small_bytes` (as f32): every rank sends its
//    buffer to every other rank and each sums them in rank order 0..n-1
//    (one message latency).
//  - larger all_reduce: ring reduce-scatter then ring all-gather. Element i
//    lies in chunk c = the c with numel*c/n <= i < numel*(c+1)/n, which is
//    summed in ring order starting at rank c+1: x[c+1] + x[c+2] + ... + x[c]
//    (indices mod n, left to right), then divided by n for the mean. Each
//    chunk moves in `segment_bytes` segments (at least 8 per chunk while they
//    stay >= 64 KiB), pipelined: a segment goes on to the next step as soon
//    as it has arrived and been added, overlapping transfer and addition.
//  - reduce_scatter: the ring reduce-scatter, chunk c being rank c's rows.
//  - all_gather and broadcast: direct sends to every rank; barrier: the
//    dissemination algorithm (log2 n rounds).
//
// Failures never hang: every message a collective waits for has a deadline
// (`timeout`), and missing it ends the collective with an error naming the
// operation and the rank it waited for; after that the communicator is
// failed and every later call throws at once. A peer whose process dies or
// whose connection breaks (UCX endpoint error) fails every pending and later
// operation that involves it, with an error naming that rank.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "redco/comm/comm.hpp"
#include "redco/comm/launch_env.hpp"
#include "redco/comm/rendezvous.hpp"

namespace redco::comm {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct UcxOptions {
  int rank = 0;
  int world_size = 1;
  std::string host0 = "127.0.0.1";  // rank 0's address; it binds only there
  int port = 29500;
  std::string job_token;
  uint64_t plan_hash = 0;
  // How long an operation may wait for one peer's message (and how long the
  // rendezvous may take).
  std::chrono::milliseconds timeout{180'000};
  // all_reduce buffers up to this size (in f32 bytes) use the direct
  // algorithm, larger ones the ring.
  size_t small_bytes = size_t(64) << 10;
  // The ring moves each chunk in segments of about this many bytes, so the
  // transfer of one overlaps the reduction of the previous one.
  size_t segment_bytes = size_t(256) << 10;
};

// The options of a rank its launcher started (redco-run, Slurm, Open MPI):
// rank, world size, host0, port, job token and timeout from `env`.
UcxOptions ucx_options(const LaunchEnv& env);

// Rendezvous, UCX set-up and endpoints; returns this rank's world communicator.
std::unique_ptr<Comm> connect_ucx(const UcxOptions& options);
// The same over a Rendezvous built by the caller (e.g. rank 0's, whose
// listener was bound earlier on an ephemeral port). `options`' rank, world
// size, host and token fields are ignored: the rendezvous has them.
std::unique_ptr<Comm> connect_ucx(Rendezvous& rendezvous, const UcxOptions& options);

}  // namespace redco::comm
