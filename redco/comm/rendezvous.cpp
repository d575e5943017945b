#include "redco/comm/rendezvous.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "redco/core/error.hpp"

namespace redco::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Caps a message so a stray connection (a port scanner, another program)
// cannot make rank 0 allocate gigabytes from a garbage length prefix.
constexpr uint32_t kMaxMessage = 64u << 20;
constexpr uint32_t kMagic = 0x72647a31;  // "rdz1": rejects peers speaking another protocol

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string errno_text() { return std::strerror(errno); }

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return int(std::max<int64_t>(0, left.count()));
}

// Waits until `fd` is ready for `events`; false on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, ms_left(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) fail("rendezvous: poll failed: {}", errno_text());
  }
}

// Partial reads and writes are normal on sockets: loop until done.
void write_all(int fd, const void* data, size_t n, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    REDCO_CHECK(wait_fd(fd, POLLOUT, deadline), "rendezvous: timed out sending");
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    REDCO_CHECK(k > 0, "rendezvous: send failed: {}", errno_text());
    p += k;
    n -= size_t(k);
  }
}

void read_all(int fd, void* data, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    REDCO_CHECK(wait_fd(fd, POLLIN, deadline), "rendezvous: timed out waiting for a reply");
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    REDCO_CHECK(k != 0, "rendezvous: the connection closed mid-message");
    REDCO_CHECK(k > 0, "rendezvous: recv failed: {}", errno_text());
    p += k;
    n -= size_t(k);
  }
}

void send_msg(int fd, const std::string& body, Clock::time_point deadline) {
  const uint32_t len = htonl(uint32_t(body.size()));
  write_all(fd, &len, 4, deadline);
  write_all(fd, body.data(), body.size(), deadline);
}

std::string recv_msg(int fd, Clock::time_point deadline) {
  uint32_t len = 0;
  read_all(fd, &len, 4, deadline);
  len = ntohl(len);
  REDCO_CHECK(len <= kMaxMessage, "rendezvous: message of {} bytes is too long", len);
  std::string body(len, '\0');
  read_all(fd, body.data(), len, deadline);
  return body;
}

// Little builders for the message bodies: fixed-width integers in network
// order and length-prefixed strings.
struct Writer {
  std::string out;
  void u32(uint32_t v) {
    v = htonl(v);
    out.append(reinterpret_cast<const char*>(&v), 4);
  }
  void u64(uint64_t v) {
    u32(uint32_t(v >> 32));
    u32(uint32_t(v));
  }
  void str(const std::string& s) {
    u32(uint32_t(s.size()));
    out += s;
  }
};

struct Reader {
  const std::string& in;
  size_t pos = 0;
  uint32_t u32() {
    REDCO_CHECK(pos + 4 <= in.size(), "rendezvous: truncated message");
    uint32_t v;
    std::memcpy(&v, in.data() + pos, 4);
    pos += 4;
    return ntohl(v);
  }
  uint64_t u64() {
    const uint64_t hi = u32();
    return hi << 32 | u32();
  }
  std::string str() {
    const uint32_t n = u32();
    REDCO_CHECK(pos + n <= in.size(), "rendezvous: truncated message");
    std::string s = in.substr(pos, n);
    pos += n;
    return s;
  }
};

struct Hello {
  int rank = 0;
  int world_size = 0;
  uint64_t plan_hash = 0;
  std::string token, blob;
};

std::string encode(const Hello& h) {
  Writer w;
  w.u32(kMagic);
  w.u32(uint32_t(h.rank));
  w.u32(uint32_t(h.world_size));
  w.u64(h.plan_hash);
  w.str(h.token);
  w.str(h.blob);
  return std::move(w.out);
}

Hello decode(const std::string& body) {
  Reader r{body};
  REDCO_CHECK(r.u32() == kMagic, "rendezvous: a peer that does not speak the redco protocol");
  Hello h;
  h.rank = int(r.u32());
  h.world_size = int(r.u32());
  h.plan_hash = r.u64();
  h.token = r.str();
  h.blob = r.str();
  return h;
}

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  REDCO_CHECK(rc == 0 && res != nullptr, "rendezvous: cannot resolve host0 '{}': {}", host,
              ::gai_strerror(rc));
  return res;
}

// One connection attempt; the error text when it fails.
std::optional<std::string> try_connect(const addrinfo* a, Fd& out, Clock::time_point deadline) {
  Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
  if (s.fd < 0) return errno_text();
  if (::connect(s.fd, a->ai_addr, a->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return errno_text();
    if (!wait_fd(s.fd, POLLOUT, deadline)) return std::string("timed out");
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return std::string(std::strerror(err));
  }
  const int one = 1;
  ::setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  out = std::move(s);
  return std::nullopt;
}

// The first mismatch between a rank's hello and rank 0's view, or "".
std::string check_hello(const Hello& h, const RendezvousOptions& o, const std::vector<bool>& seen) {
  if (h.world_size != o.world_size)
    return fmt::format("rank {} says world size {} but rank 0 says {}", h.rank, h.world_size,
                       o.world_size);
  if (h.rank <= 0 || h.rank >= o.world_size)
    return fmt::format("a rank says it is rank {}, outside 1..{} (world size {})", h.rank,
                       o.world_size - 1, o.world_size);
  if (seen[size_t(h.rank)])
    return fmt::format("two processes both say they are rank {}; give each a distinct rank",
                       h.rank);
  if (h.token != o.job_token)
    return fmt::format(
        "rank {} has a different job token than rank 0: it belongs to another job, or the "
        "launcher gave the ranks different tokens",
        h.rank);
  if (h.plan_hash != o.plan_hash)
    return fmt::format(
        "rank {} has model plan hash {:016x} but rank 0 has {:016x}: every rank must build the "
        "same model and parallel plan",
        h.rank, h.plan_hash, o.plan_hash);
  return "";
}

// Rank 0's reply: every blob, or the reason the rendezvous failed.
void answer(std::vector<Fd>& conns, const std::string& why, const std::vector<std::string>& blobs,
            Clock::time_point deadline) {
  Writer reply;
  reply.u32(why.empty() ? 1 : 0);
  if (why.empty()) {
    for (const std::string& b : blobs) reply.str(b);
  } else {
    reply.str(why);
  }
  for (Fd& c : conns) {
    try {
      send_msg(c.fd, reply.out, deadline);
    } catch (const Error&) {
      // A rank that vanished cannot be told; the others still are.
    }
  }
}

}  // namespace

Rendezvous::Rendezvous(RendezvousOptions options) : options_(std::move(options)) {
  const RendezvousOptions& o = options_;
  REDCO_CHECK(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size,
              "rendezvous: rank {} is not in a world of size {}", o.rank, o.world_size);
  REDCO_CHECK(o.port >= 0 && o.port < 65536, "rendezvous: port {} is out of range", o.port);
  port_ = o.port;
  if (o.rank != 0 || o.world_size == 1) return;
  addrinfo* res = resolve(o.host0, o.port, true);
  std::string why;
  for (addrinfo* a = res; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    const int one = 1;
    ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s.fd >= 0 && ::bind(s.fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(s.fd, 128) == 0) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      ::getsockname(s.fd, reinterpret_cast<sockaddr*>(&addr), &len);
      port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(addr).sin6_port
                                               : reinterpret_cast<sockaddr_in&>(addr).sin_port);
      listen_fd_ = std::exchange(s.fd, -1);
    } else {
      why = errno_text();
    }
  }
  ::freeaddrinfo(res);
  REDCO_CHECK(listen_fd_ >= 0,
              "rendezvous: rank 0 cannot listen on {}:{}: {} (is host0 an address of this "
              "machine, and is the port free?)",
              o.host0, o.port, why);
}

Rendezvous::~Rendezvous() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::vector<std::string> Rendezvous::exchange(const std::string& blob) {
  REDCO_CHECK(blob.size() <= kMaxMessage / 2, "rendezvous: a blob of {} bytes is too long",
              blob.size());
  if (options_.world_size == 1) return {blob};
  return options_.rank == 0 ? serve(blob) : join(blob);
}

// Rank 0: accept world_size - 1 hellos, check them, answer everyone.
std::vector<std::string> Rendezvous::serve(const std::string& blob) {
  const RendezvousOptions& o = options_;
  REDCO_CHECK(listen_fd_ >= 0, "rendezvous: exchange() may be called only once");
  const Clock::time_point deadline = Clock::now() + o.timeout;
  std::vector<Fd> conns;
  std::vector<std::string> blobs(size_t(o.world_size));
  std::vector<bool> seen(size_t(o.world_size), false);
  blobs[0] = blob;
  seen[0] = true;
  std::string why;
  Clock::time_point until = deadline;
  while (int(conns.size()) < o.world_size - 1) {
    if (!wait_fd(listen_fd_, POLLIN, until)) {
      if (!why.empty()) break;
      std::vector<int> missing;
      for (int r = 1; r < o.world_size; ++r)
        if (!seen[size_t(r)]) missing.push_back(r);
      why = fmt::format("rank 0 timed out after {} ms: rank(s) {} never joined the rendezvous",
                        o.timeout.count(), fmt::join(missing, ", "));
      break;
    }
    Fd c(::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC));
    if (c.fd < 0) continue;
    Hello h;
    try {
      h = decode(recv_msg(c.fd, deadline));
    } catch (const Error&) {
      continue;  // not one of ours (or it died mid-hello): ignore the connection
    }
    const std::string bad = check_hello(h, o, seen);
    if (bad.empty() && h.rank > 0 && h.rank < o.world_size) {
      seen[size_t(h.rank)] = true;
      blobs[size_t(h.rank)] = std::move(h.blob);
    }
    if (!bad.empty() && why.empty()) {
      why = bad;
      // Ranks already on their way are told too, briefly, rather than
      // finding a closed port.
      until = std::min(deadline, Clock::now() + std::chrono::milliseconds(500));
    }
    conns.push_back(std::move(c));
  }
  ::close(std::exchange(listen_fd_, -1));
  answer(conns, why, blobs, deadline);
  REDCO_CHECK(why.empty(), "rendezvous failed: {}", why);
  return blobs;
}

std::vector<std::string> Rendezvous::join(const std::string& blob) {
  const RendezvousOptions& o = options_;
  const Clock::time_point deadline = Clock::now() + o.timeout;
  addrinfo* res = resolve(o.host0, o.port, false);
  Fd conn;
  std::string last = "no address";
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    for (addrinfo* a = res; a != nullptr && conn.fd < 0; a = a->ai_next)
      if (auto err = try_connect(a, conn, deadline)) last = *err;
    if (conn.fd >= 0 || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::min(backoff, std::chrono::milliseconds(ms_left(deadline))));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  ::freeaddrinfo(res);
  REDCO_CHECK(conn.fd >= 0,
              "rendezvous: rank {} could not reach rank 0 at host0 {}:{} within {} ms (last "
              "error: {}); start rank 0 and check that host0 and the port name rank 0's "
              "machine and are reachable from this one",
              o.rank, o.host0, o.port, o.timeout.count(), last);
  send_msg(conn.fd, encode({o.rank, o.world_size, o.plan_hash, o.job_token, blob}), deadline);
  std::string body;
  try {
    // Rank 0 gives the verdict, also on a timeout: wait a little longer than
    // it does, so that its reason (e.g. which rank never came) arrives.
    body = recv_msg(conn.fd, deadline + std::chrono::seconds(2));
  } catch (const Error& e) {
    fail("rendezvous: rank {} got no answer from rank 0 at {}:{}: {}", o.rank, o.host0, o.port,
         e.what());
  }
  Reader r{body};
  if (r.u32() == 0) fail("rendezvous failed: {}", r.str());
  std::vector<std::string> blobs;
  for (int i = 0; i < o.world_size; ++i) blobs.push_back(r.str());
  return blobs;
}

}  // namespace redco::comm
