// redco-run: starts the ranks of one job on this node and supervises them.
//
//   redco-run -n 4 ./build/samples/language_modeling --n_model_shards 2
//   redco-run -n 8 --nnodes 2 --node-rank 1 --host0 node01:29500 -- ./prog
//   srun --ntasks-per-node=1 redco-run -n 8 --from-env -- ./prog
//
// Each child gets the REDCO_* variables that comm::detect_launch_env() reads
// (global rank = node_rank * n + local rank). Output is forwarded line by line,
// every rank's (with a `[rank r] ` prefix when there are several) or rank 0's
// only (--output, --prefix; options.hpp). If any rank fails, the others
// are stopped (SIGTERM, then SIGKILL after --grace seconds) and redco-run exits
// with the failed rank's status (128 + signal for a signal), because a job
// with a dead rank can only hang or fail later. A rank that hangs (see
// hang_watch.hpp; --hang-timeout) is named and stopped the same way. A
// SIGINT or SIGTERM to redco-run (Ctrl-C) is passed on to the ranks and
// reported as such, with status 128 + the signal (130 for Ctrl-C); no rank is
// blamed for it. Errors of redco-run's own: 2 for the command line, 1 for the
// rest (exit_status.hpp).
//
// Restarts (--max-restarts N, torchrun's semantics): after a failure the
// whole job is started again, up to N times, each attempt with REDCO_RESTART
// = 1, 2, ... (the Trainer then resumes from its latest checkpoint). On
// several nodes every redco-run restarts its own ranks: a failure anywhere
// stops the ranks everywhere (peers see the death), so all nodes restart
// together and meet again at --host0.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "exit_status.hpp"
#include "hang_watch.hpp"
#include "options.hpp"
#include "redco/comm/launch_env.hpp"
#include "redco/core/error.hpp"

namespace {

using namespace redco;
using Clock = std::chrono::steady_clock;
using run::Options;

// A failure the command line caused (a program that cannot be started): exit 2.
struct UsageError : Error {
  using Error::Error;
};

// Where the job's ranks meet, decided once per launcher.
struct JobPlan {
  int nprocs = 1, nnodes = 1, node_rank = 0;
  std::string host0;
  int port = 0;
  std::string token;
};

// A free TCP port on loopback for a single-node job. Another process could
// take it before rank 0 binds it; the window is short and the failure is a
// clear rendezvous error, not a hang.
int free_local_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REDCO_CHECK(fd >= 0, "cannot open a socket to pick a port: {}", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  REDCO_CHECK(ok, "cannot pick a free port on 127.0.0.1: pass --host0 127.0.0.1:PORT");
  return ntohs(addr.sin_port);
}

JobPlan plan_from_env(const Options& o) {
  comm::LaunchEnv le = comm::detect_launch_env();
  REDCO_CHECK(le.source == "slurm" || le.source == "openmpi",
              "--from-env: no Slurm or Open MPI environment found (source '{}'); start "
              "redco-run with srun or mpirun, one per node, or pass --nnodes/--node-rank/--host0",
              le.source);
  // One redco-run per node: the starter's rank is this node's index.
  return {o.nprocs, le.world_size, le.rank, le.host0, le.port, le.job_token};
}

JobPlan make_plan(const Options& o) {
  REDCO_CHECK(o.nprocs >= 1, "-n {}: give at least one process per node", o.nprocs);
  if (o.from_env) return plan_from_env(o);
  REDCO_CHECK(o.nnodes >= 1, "--nnodes {}: give at least one node", o.nnodes);
  REDCO_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes,
              "--node-rank {} is outside [0, --nnodes {}): number the nodes 0..{}", o.node_rank,
              o.nnodes, o.nnodes - 1);
  JobPlan p{o.nprocs, o.nnodes, o.node_rank, "127.0.0.1", 0, ""};
  if (o.host0.empty()) {
    REDCO_CHECK(o.nnodes == 1,
                "--nnodes {} needs --host0 ADDR:PORT: the address of node 0 (--node-rank 0) and "
                "a free port there, the same on every node",
                o.nnodes);
    p.port = free_local_port();
    p.token = comm::random_job_token();
    return p;
  }
  comm::HostPort hp = comm::parse_host_port(o.host0, "--host0");
  comm::check_resolvable(hp.host, "--host0");
  p.host0 = hp.host;
  p.port = hp.port;
  // Launchers on different nodes cannot share a random value, so the token is
  // derived from what they are all given.
  p.token = o.nnodes == 1 && o.job_id == "default" ? comm::random_job_token()
                                                   : "job-" + o.job_id + "@" + o.host0;
  return p;
}

// This process's environment plus the REDCO_* variables of one rank.
std::vector<std::string> child_environ(const JobPlan& p, const Options& o, int local, int restart,
                                       const run::HangWatch& watch) {
  comm::Environ env = comm::current_environ();
  std::string host = p.host0.find(':') != std::string::npos ? "[" + p.host0 + "]" : p.host0;
  env["REDCO_RANK"] = std::to_string(p.node_rank * p.nprocs + local);
  env["REDCO_WORLD_SIZE"] = std::to_string(p.nnodes * p.nprocs);
  env["REDCO_LOCAL_RANK"] = std::to_string(local);
  env["REDCO_LOCAL_WORLD_SIZE"] = std::to_string(p.nprocs);
  env["REDCO_NODE_RANK"] = std::to_string(p.node_rank);
  env["REDCO_NNODES"] = std::to_string(p.nnodes);
  env["REDCO_HOST0"] = host + ":" + std::to_string(p.port);
  env["REDCO_JOB_TOKEN"] = p.token;
  env["REDCO_TIMEOUT"] = fmt::format("{}", o.timeout_s);
  env["REDCO_RESTART"] = std::to_string(restart);
  env["REDCO_MAX_RESTARTS"] = std::to_string(o.max_restarts);
  // An outer redco-run's heartbeat slot is not this job's to write.
  for (const char* k : {"REDCO_HEARTBEAT_FD", "REDCO_HEARTBEAT_SLOT", "REDCO_HANG_TIMEOUT"})
    env.erase(k);
  watch.export_to(env, local);
  env.erase("REDCO_PORT");  // REDCO_HOST0 already carries the port
  std::vector<std::string> out;
  for (auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

// ---- signals: the handler only writes the signal number to a pipe, which
// the supervision loop polls together with the children's output.
int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

void install_signal_handlers() {
  REDCO_CHECK(pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "pipe: {}", std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaction(s, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the supervisor
}

void write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = write(fd, s.data(), s.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone; keep supervising
    s.remove_prefix(static_cast<std::size_t>(n));
  }
}

struct Stream {
  int fd = -1;
  int target = 1;  // our fd the lines go to
  std::string pending;
};

struct Child {
  int rank = 0;
  int local = 0;  // index on this node (the heartbeat slot)
  pid_t pid = -1;
  bool running = false;
  bool shown = true;
  bool prefixed = true;  // "[rank r] " before each line (run::prefixed)
  Stream out, err;
  std::deque<std::string> tail;  // last lines of a hidden rank, shown if it fails
};

void spawn_child(Child& c, const std::vector<std::string>& argv,
                 const std::vector<std::string>& envs) {
  int out[2], err[2];
  REDCO_CHECK(pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0, "pipe: {}",
              std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  // Own process group: stopping a rank also stops whatever it started.
  posix_spawnattr_setpgroup(&at, 0);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setsigdefault(&at, &defaults);
  posix_spawnattr_setflags(&at,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> av, ev;
  for (auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  for (auto& e : envs) ev.push_back(const_cast<char*>(e.c_str()));
  av.push_back(nullptr);
  ev.push_back(nullptr);
  int rc = posix_spawnp(&c.pid, av[0], &fa, &at, av.data(), ev.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  close(out[1]);
  close(err[1]);
  c.out = {out[0], 1, {}};
  c.err = {err[0], 2, {}};
  if (rc != 0)
    throw UsageError(
        fmt::format("cannot start '{}' for rank {}: {}", argv[0], c.rank, std::strerror(rc)));
  c.running = true;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}

int exit_code_of(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

// How one attempt at the job ended.
struct Outcome {
  int code = 0;          // redco-run's exit status for it
  std::string failure;   // the first failure, e.g. "rank 1 was killed by signal 9 (Killed)"
  bool by_user = false;  // stopped by a signal to redco-run: not to be restarted
};

class Supervisor {
 public:
  Supervisor(std::vector<Child> kids, double grace_s, run::HangWatch& watch)
      : kids_(std::move(kids)), grace_(grace_s), watch_(watch) {}
  Outcome run();

 private:
  void emit(Child& c, Stream& s, std::string_view line);
  void pump(Child& c, Stream& s);
  void on_signals();
  void reap();
  void check_hangs();
  void stop_all();
  void signal_all(int sig);
  void print_tail();
  void report_interrupt();
  std::vector<pollfd> poll_set() const;

  std::vector<Child> kids_;
  double grace_;
  run::HangWatch& watch_;
  int failed_ = -1;            // index of the first rank that failed
  int user_signal_ = 0;        // the first SIGINT/SIGTERM/SIGHUP redco-run received
  int interrupted_ranks_ = 0;  // ranks running when it came
  Outcome out_;
  bool stopping_ = false, killed_ = false;
  Clock::time_point kill_at_{}, drain_until_{}, next_check_{};
};

void Supervisor::emit(Child& c, Stream& s, std::string_view line) {
  std::string text = fmt::format("[rank {}] {}", c.rank, line);
  if (text.back() != '\n') text += '\n';
  if (c.shown) {
    // One write per line, so lines of different ranks never interleave.
    write_all(s.target, c.prefixed ? std::string_view(text)
                                   : std::string_view(text).substr(text.find(']') + 2));
    return;
  }
  c.tail.push_back(std::move(text));
  if (c.tail.size() > 20) c.tail.pop_front();
}

void Supervisor::pump(Child& c, Stream& s) {
  char buf[65536];
  ssize_t n = read(s.fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {  // end of stream: flush an unterminated last line
    if (!s.pending.empty()) emit(c, s, s.pending);
    s.pending.clear();
    close(s.fd);
    s.fd = -1;
    return;
  }
  s.pending.append(buf, static_cast<std::size_t>(n));
  std::size_t start = 0, nl;
  while ((nl = s.pending.find('\n', start)) != std::string::npos) {
    emit(c, s, std::string_view(s.pending).substr(start, nl + 1 - start));
    start = nl + 1;
  }
  s.pending.erase(0, start);
  // A line this long is passed on in pieces rather than held without bound.
  if (s.pending.size() >= sizeof buf) {
    emit(c, s, s.pending);
    s.pending.clear();
  }
}

void Supervisor::signal_all(int sig) {
  // The whole process group of each running rank; the group of a rank that
  // already ended was killed when it was reaped (its id may be reused since).
  for (const Child& c : kids_)
    if (c.running) kill(-c.pid, sig);
}

void Supervisor::reap() {
  int status = 0;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (std::size_t i = 0; i < kids_.size(); ++i) {
      Child& c = kids_[i];
      if (c.pid != pid) continue;
      c.running = false;
      // The rank is gone; anything it left running in its group goes too.
      kill(-c.pid, SIGKILL);
      bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      // A rank ending after the user's signal was stopped, not failed.
      if (!failed || failed_ >= 0 || user_signal_ != 0) continue;
      failed_ = static_cast<int>(i);
      out_.code = exit_code_of(status);
      out_.failure = fmt::format("rank {} {}", c.rank, describe_status(status));
      std::string msg = "redco-run: " + out_.failure;
      if (!stopping_) msg += "; stopping the other ranks";
      write_all(2, msg + "\n");
      if (!stopping_) stop_all();
    }
  }
}

// SIGTERM to every rank, SIGKILL to those left after the grace period.
void Supervisor::stop_all() {
  stopping_ = true;
  kill_at_ = Clock::now() +
             std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_));
  signal_all(SIGTERM);
}

// A hung rank is killed at once (SIGTERM would wait behind a SIGSTOP), the
// others are stopped as after a failure; exit status 124, as timeout(1)'s.
void Supervisor::check_hangs() {
  if (stopping_ || !watch_.on() || Clock::now() < next_check_) return;
  next_check_ = Clock::now() + std::chrono::milliseconds(watch_.period_ms());
  if (!watch_.begin_round()) return;
  for (std::size_t i = 0; i < kids_.size(); ++i) {
    Child& c = kids_[i];
    if (!c.running) continue;
    const std::string why = watch_.check(c.local, c.pid, c.rank);
    if (why.empty()) continue;
    failed_ = static_cast<int>(i);
    out_ = {124, why, false};
    write_all(2, "redco-run: " + why + "; stopping the job\n");
    kill(-c.pid, SIGKILL);
    stop_all();
    return;
  }
}

void Supervisor::on_signals() {
  unsigned char sigs[64];
  ssize_t n;
  while ((n = read(g_signal_pipe[0], sigs, sizeof sigs)) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      if (sigs[i] == SIGCHLD) continue;
      if (user_signal_ == 0) {
        user_signal_ = sigs[i];
        for (const Child& c : kids_) interrupted_ranks_ += c.running ? 1 : 0;
      }
      // Forward the user's signal; if the ranks ignore it, SIGKILL follows.
      signal_all(sigs[i]);
      out_.by_user = true;
      if (!stopping_) {
        stopping_ = true;
        kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(grace_));
      }
    }
  }
  reap();
}

std::vector<pollfd> Supervisor::poll_set() const {
  std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
  for (const Child& c : kids_)
    for (const Stream* s : {&c.out, &c.err})
      if (s->fd >= 0) fds.push_back({s->fd, POLLIN, 0});
  return fds;
}

Outcome Supervisor::run() {
  reap();  // a rank may have died before the loop started
  for (;;) {
    bool running = false, open = false;
    for (const Child& c : kids_) {
      running |= c.running;
      open |= c.out.fd >= 0 || c.err.fd >= 0;
    }
    if (!running && !open) break;
    auto now = Clock::now();
    if (stopping_ && !killed_ && running && now >= kill_at_) {
      signal_all(SIGKILL);
      killed_ = true;
    }
    // All ranks are gone but something that escaped their groups still holds
    // a pipe: drain briefly, then stop listening rather than wait forever.
    if (!running && drain_until_ == Clock::time_point{})
      drain_until_ = now + std::chrono::seconds(2);
    if (!running && now >= drain_until_) {
      for (Child& c : kids_)
        for (Stream* s : {&c.out, &c.err})
          if (s->fd >= 0) close(std::exchange(s->fd, -1));
      break;
    }
    std::vector<pollfd> fds = poll_set();
    int wait_ms = stopping_ || !running ? 100 : watch_.on() ? watch_.period_ms() : 1000;
    if (poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR)
      fail("poll: {}", std::strerror(errno));
    for (Child& c : kids_)
      for (Stream* s : {&c.out, &c.err})
        for (const pollfd& p : fds)
          if (p.fd == s->fd && s->fd >= 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)))
            pump(c, *s);
    on_signals();
    check_hangs();
  }
  if (user_signal_ != 0 && failed_ < 0) report_interrupt();
  print_tail();
  return out_;
}

// The job was stopped by the user, not by a rank: say so, and exit as a shell
// reports a command stopped by that signal (130 for Ctrl-C).
void Supervisor::report_interrupt() {
  const std::string why =
      user_signal_ == SIGINT
          ? std::string("interrupted (Ctrl-C)")
          : fmt::format("received signal {} ({})", user_signal_, strsignal(user_signal_));
  write_all(2, fmt::format("redco-run: {}: stopped {} rank{}\n", why, interrupted_ranks_,
                           interrupted_ranks_ == 1 ? "" : "s"));
  out_.code = 128 + user_signal_;
}

void Supervisor::print_tail() {
  if (failed_ < 0 || kids_[failed_].shown || kids_[failed_].tail.empty()) return;
  write_all(2, fmt::format("redco-run: last output of rank {}:\n", kids_[failed_].rank));
  for (const std::string& line : kids_[failed_].tail) write_all(2, line);
}

// One attempt at the job: start every local rank, supervise until all end.
Outcome run_job(const JobPlan& plan, const Options& o, int restart, run::HangWatch& watch) {
  watch.reset();
  std::vector<Child> kids(plan.nprocs);
  for (int local = 0; local < plan.nprocs; ++local) {
    Child& c = kids[local];
    c.rank = plan.node_rank * plan.nprocs + local;
    c.local = local;
    c.shown = o.output == "all" || c.rank == 0;
    c.prefixed = run::prefixed(o, plan.nnodes * plan.nprocs);
    try {
      spawn_child(c, o.command, child_environ(plan, o, local, restart, watch));
    } catch (const Error&) {
      for (const Child& k : kids)
        if (k.pid > 0) kill(-k.pid, SIGKILL);
      throw;
    }
  }
  return Supervisor(std::move(kids), o.grace_s, watch).run();
}

// Attempts until one succeeds, the user stops the job, or the restarts run out.
int run_with_restarts(JobPlan plan, const Options& o) {
  run::HangWatch watch(plan.nprocs, o.hang_timeout_s);
  for (int restart = 0;; ++restart) {
    const Outcome out = run_job(plan, o, restart, watch);
    if (out.code == 0 || out.by_user) return out.code;
    if (restart >= o.max_restarts) {
      if (o.max_restarts > 0)
        write_all(2, fmt::format("redco-run: giving up after {} restart{} (--max-restarts {}); "
                                 "the last failure: {}\n",
                                 restart, restart == 1 ? "" : "s", o.max_restarts, out.failure));
      return out.code;
    }
    write_all(2, fmt::format("redco-run: restarting the job (restart {} of {}) after: {}\n",
                             restart + 1, o.max_restarts, out.failure));
    // A job of this node alone meets on a fresh port, under a fresh token, so
    // no straggler of the last attempt can join the new one.
    if (plan.nnodes == 1 && o.host0.empty() && !o.from_env) {
      plan.port = free_local_port();
      plan.token = comm::random_job_token();
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (const int rc = run::parse_options(o, argc, argv); rc >= 0) return rc;
  JobPlan plan;
  try {
    plan = make_plan(o);
  } catch (const Error& e) {  // --host0, --node-rank, --from-env outside a job...
    std::fprintf(stderr, "redco-run: error: %s\n", e.what());
    return exit_status::usage_error;
  }
  try {
    install_signal_handlers();
    return run_with_restarts(plan, o);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "redco-run: error: %s\n", e.what());
    return exit_status::usage_error;
  } catch (const Error& e) {
    std::fprintf(stderr, "redco-run: error: %s\n", e.what());
    return exit_status::runtime_error;
  }
}
