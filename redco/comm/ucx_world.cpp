// The UCX world: World's methods, the UCX completion callbacks, and the
// connection set-up (worker, endpoints, log handler). See ucx_world.hpp.
#include "redco/comm/ucx_world.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "redco/core/error.hpp"

namespace redco::comm::ucx_detail {
namespace {

void check_ucs(ucs_status_t st, const char* what) {
  REDCO_CHECK(st == UCS_OK, "UCX: {} failed: {}", what, ucs_status_string(st));
}

// Under the lock (UCX calls callbacks from inside its own functions).
void on_done(Op* raw, void* request, ucs_status_t st, size_t length) {
  World& w = *raw->world;
  ucp_request_free(request);
  raw->req = nullptr;
  auto it = w.pending.find(raw);
  if (it == w.pending.end()) return;
  const OpPtr op = it->second;
  w.pending.erase(it);
  std::string why;
  if (st == UCS_ERR_MESSAGE_TRUNCATED || (st == UCS_OK && op->is_recv && length != op->expect)) {
    why = fmt::format("rank {} sent a message of a different size than the {} bytes expected",
                      op->peer, op->expect);
  } else if (st != UCS_OK && st != UCS_ERR_CANCELED) {  // UCX's verdict on the peer
    why = fmt::format("rank {} failed or disconnected (UCX: {})", op->peer, ucs_status_string(st));
    w.peer_failed(op->peer, why);
  } else if (st == UCS_ERR_CANCELED) {
    why = "cancelled";
  }
  w.finish(op, why);
}

void send_cb(void* request, ucs_status_t st, void* user) {
  on_done(static_cast<Op*>(user), request, st, 0);
}
void recv_cb(void* request, ucs_status_t st, const ucp_tag_recv_info_t* info, void* user) {
  on_done(static_cast<Op*>(user), request, st, info != nullptr ? info->length : 0);
}
void ep_error_cb(void* arg, ucp_ep_h, ucs_status_t st) {
  auto [w, rank] = *static_cast<std::pair<World*, int>*>(arg);
  w->peer_failed(
      rank, fmt::format("rank {} failed or disconnected (UCX: {})", rank, ucs_status_string(st)));
}

}  // namespace

void deliver(std::vector<std::pair<OpPtr, std::string>> fired) {
  for (auto& [op, why] : fired)
    why.empty() ? op->done.set() : op->done.set_exception(std::make_exception_ptr(Error(why)));
}

void World::peer_failed(int peer, const std::string& why) {
  if (closing || !dead[size_t(peer)].empty()) return;
  dead[size_t(peer)] = why;
  std::vector<OpPtr> hit;  // cancelling runs callbacks, which edit `pending`
  for (auto& [raw, op] : pending)
    if (op->peer == peer && !op->completed) hit.push_back(op);
  for (const OpPtr& op : hit) abort(op, why);
}

// A missed deadline leaves the sequence of calls out of step with the peers,
// so it fails the whole communicator.
void World::check_timeouts() {
  const Clock::time_point now = Clock::now();
  if (now - last_check < std::chrono::milliseconds(1)) return;
  last_check = now;
  const double secs = std::chrono::duration<double>(options.timeout).count();
  std::vector<OpPtr> late;
  for (auto& [raw, op] : pending)
    if (!op->completed && now > op->deadline) late.push_back(op);
  for (const OpPtr& op : late) {
    const std::string why =
        fmt::format("timed out after {:g} s waiting for rank {} to {}", secs, op->peer,
                    op->is_recv ? "send its message" : "take this rank's message");
    if (failure.empty()) failure = why;
    abort(op, why);
  }
}

bool World::poll() {
  std::vector<std::pair<OpPtr, std::string>> fired;
  bool progressed;
  {
    std::lock_guard lock(mutex);
    progressed = ucp_worker_progress(worker) != 0;
    check_timeouts();
    fired = settle();
  }
  progressed |= !fired.empty();
  deliver(std::move(fired));
  return progressed;
}

// Spinning on ucp_worker_progress while a slow link drains took a third of
// a core per rank (two ranks on 2 cores over a 1 Gbit/s link: 17 of every
// 50 s), CPU the compute threads needed. Armed, the worker's descriptor
// turns readable when a socket has data or room, or on signal().
void World::idle_wait(std::chrono::microseconds most) {
  {
    std::lock_guard lock(mutex);
    if (event_fd < 0 || closing || ucp_worker_arm(worker) != UCS_OK) return;  // busy: poll again
  }
  pollfd fd{.fd = event_fd, .events = POLLIN, .revents = 0};
  ::poll(&fd, 1, int(std::max<int64_t>(1, most.count() / 1000)));
}

void World::signal() {
  std::lock_guard lock(mutex);
  if (event_fd >= 0 && !closing) ucp_worker_signal(worker);
}

// Under the lock, before closing: one message to and from every live peer,
// waited for (at most 2 s; a dead peer is not waited for). Without it a rank
// whose last operation finished first closed its endpoints while a peer was
// still receiving its last message there, and that peer saw its final
// barrier fail with "Endpoint timeout" (3-rank test, ~3% of runs).
void World::say_goodbye() {
  // A collective's step field never reaches kMaxSteps - 1 (a ring has 2(n-1)
  // steps, n <= kMaxRanks), so this tag is the handshake's alone.
  constexpr int kGoodbyeStep = kMaxSteps - 1;
  goodbyes.assign(size_t(size) * 2, 1);      // [0, size): sent, [size, 2 size): received
  std::vector<std::pair<int, void*>> waits;  // (peer, request)
  ucp_request_param_t none{};
  for (int r = 0; r < size; ++r) {
    if (r == rank || eps[size_t(r)] == nullptr || !dead[size_t(r)].empty()) continue;
    const uint64_t to_peer = make_tag(false, 0, rank, kGoodbyeStep, 0);
    const uint64_t from_peer = make_tag(false, 0, r, kGoodbyeStep, 0);
    void* in =
        ucp_tag_recv_nbx(worker, &goodbyes[size_t(size + r)], 1, from_peer, ~uint64_t(0), &none);
    void* out = ucp_tag_send_nbx(eps[size_t(r)], &goodbyes[size_t(r)], 1, to_peer, &none);
    for (void* q : {in, out})
      if (UCS_PTR_IS_PTR(q)) waits.emplace_back(r, q);
  }
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(2);
  for (auto& [r, q] : waits) {
    while (ucp_request_check_status(q) == UCS_INPROGRESS && dead[size_t(r)].empty() &&
           Clock::now() < deadline)
      ucp_worker_progress(worker);
    if (ucp_request_check_status(q) == UCS_INPROGRESS) ucp_request_cancel(worker, q);
    ucp_request_free(q);
  }
}

// Says goodbye to the peers, then flushes and closes the endpoints (bounded:
// a dead peer cannot hold us), so messages this rank sent last still reach
// peers that are alive.
World::~World() {
  if (engine) engine->stop();
  std::lock_guard lock(mutex);
  if (worker != nullptr && failure.empty()) say_goodbye();
  closing = true;
  std::vector<OpPtr> left;  // cancelling runs callbacks, which edit `pending`
  for (auto& [raw, op] : pending) left.push_back(op);
  for (const OpPtr& op : left)
    if (op->is_recv && op->req != nullptr) ucp_request_cancel(worker, op->req);
  std::vector<void*> closes;
  const ucp_request_param_t flush{};  // no flags: flush, then close
  ucp_request_param_t force{};        // a dead peer cannot answer a flush
  force.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  force.flags = UCP_EP_CLOSE_FLAG_FORCE;
  for (size_t r = 0; r < eps.size(); ++r)
    for (ucp_ep_h ep : {eps[r], guards[r]})
      if (void* q = ep ? ucp_ep_close_nbx(ep, dead[r].empty() ? &flush : &force) : nullptr;
          UCS_PTR_IS_PTR(q))
        closes.push_back(q);
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(2);
  for (void* r : closes) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline)
      ucp_worker_progress(worker);
    ucp_request_free(r);
  }
  // Ops stay alive until the worker is gone: destroying it may still call
  // their callbacks.
  if (worker != nullptr) ucp_worker_destroy(worker);
  if (context != nullptr) ucp_cleanup(context);
  pending.clear();
  to_fire.clear();
}

// Under the lock: hands `op` to UCX, or fails it at once when its peer or
// the communicator is known to be gone.
void World::submit(const OpPtr& op, uint64_t tag, void* buf, size_t len) {
  if (!failure.empty()) return finish(op, "the communicator failed earlier: " + failure);
  if (!dead[size_t(op->peer)].empty()) return finish(op, dead[size_t(op->peer)]);
  pending[op.get()] = op;
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.user_data = op.get();
  void* r;
  if (op->is_recv) {
    p.cb.recv = recv_cb;
    r = ucp_tag_recv_nbx(worker, buf, len, tag, ~uint64_t(0), &p);
  } else {
    p.cb.send = send_cb;
    r = ucp_tag_send_nbx(eps[size_t(op->peer)], buf, len, tag, &p);
  }
  if (UCS_PTR_IS_ERR(r)) {
    pending.erase(op.get());
    finish(op, fmt::format("rank {}: UCX {}", op->peer, ucs_status_string(UCS_PTR_STATUS(r))));
  } else if (r == nullptr) {
    pending.erase(op.get());
    finish(op, "");
  } else if (pending.count(op.get()) != 0) {
    op->req = r;  // still in flight: its callback has not run yet
  }
}

namespace {

// What decides whether two ranks can share memory: the same kernel boot and
// the same network, IPC and PID namespaces (ranks in different network
// namespaces are treated as different hosts, as they are in the netns test).
std::string host_identity() {
  std::string id;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  id += name;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string line;
  std::getline(boot, line);
  id += "|" + line;
  for (const char* ns : {"net", "ipc", "pid"}) {
    char link[128] = {};
    const std::string path = std::string("/proc/self/ns/") + ns;
    if (::readlink(path.c_str(), link, sizeof link - 1) > 0) id += std::string("|") + link;
  }
  return id;
}

ucp_ep_h open_ep(World& w, int r, const std::string& address, bool handle_errors) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  ep.err_mode = handle_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  if (handle_errors) {
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_handler.cb = ep_error_cb;
    ep.err_handler.arg = &w.peer_args[size_t(r)];
  }
  ucp_ep_h h = nullptr;
  const ucs_status_t st = ucp_ep_create(w.worker, &ep, &h);
  REDCO_CHECK(st == UCS_OK, "UCX: rank {} cannot open an endpoint to rank {}: {}", w.rank, r,
              ucs_status_string(st));
  return h;
}

}  // namespace

// `blobs` are "identity\0address". A peer on another host gets one endpoint
// that detects its failure (UCX then picks TCP or RDMA). UCX 1.13 offers no
// shared-memory transport that detects a dead peer, so a same-host peer gets
// two: one without error handling for data (shared memory, single-copy CMA
// for large messages) and an idle one with it (TCP), whose error callback
// reports the peer's death.
void connect_peers(World& w, const std::vector<std::string>& blobs) {
  w.eps.assign(size_t(w.size), nullptr);
  w.guards.assign(size_t(w.size), nullptr);
  w.peer_args.resize(size_t(w.size));  // sized once: endpoints keep pointers into it
  const std::string& mine = blobs[size_t(w.rank)];
  const std::string my_id = mine.substr(0, mine.find('\0'));
  for (int r = 0; r < w.size; ++r) {
    if (r == w.rank) continue;
    w.peer_args[size_t(r)] = {&w, r};
    const std::string& blob = blobs[size_t(r)];
    const size_t cut = blob.find('\0');
    REDCO_CHECK(cut != std::string::npos, "UCX: rank {} sent a malformed address", r);
    const std::string address = blob.substr(cut + 1);
    const bool local = blob.compare(0, cut, my_id) == 0;
    w.eps[size_t(r)] = open_ep(w, r, address, !local);
    if (local) w.guards[size_t(r)] = open_ep(w, r, address, true);
  }
}

namespace {

// A same-host peer's data endpoint has no error handling (see connect_peers),
// and UCX 1.13 makes a failed single-copy read from a process that has just
// died fatal (abort) on such an endpoint. That death is reported properly by
// the peer's guard endpoint a moment later, so this log handler swallows
// exactly that message and lets UCX fail the transfer instead.
ucs_log_func_rc_t swallow_dead_peer_read(const char* file, unsigned, const char*,
                                         ucs_log_level_t level, const ucs_log_component_config_t*,
                                         const char* message, va_list ap) {
  if (level != UCS_LOG_LEVEL_FATAL || std::strstr(file, "cma_ep.c") == nullptr)
    return UCS_LOG_FUNC_RC_CONTINUE;
  char text[512];
  va_list copy;
  va_copy(copy, ap);
  std::vsnprintf(text, sizeof text, message, copy);
  va_end(copy);
  return std::strstr(text, "No such process") != nullptr ? UCS_LOG_FUNC_RC_STOP
                                                         : UCS_LOG_FUNC_RC_CONTINUE;
}

}  // namespace

bool tcp_only(const char* tls) {
  if (tls == nullptr || *tls == '\0' || *tls == '^') return false;
  bool tcp = false;
  for (const char* p = tls; *p != '\0';) {
    const char* end = std::strchr(p, ',');
    const std::string t(p, end ? size_t(end - p) : std::strlen(p));
    if (t == "tcp")
      tcp = true;
    else if (t != "self")
      return false;
    p = end ? end + 1 : p + t.size();
  }
  return tcp;
}

// UCX context and worker; returns "identity\0address" for the rendezvous.
std::string init_worker(World& w) {
  static std::once_flag hook;
  std::call_once(hook, [] { ucs_log_push_handler(swallow_dead_peer_read); });
  ucp_config_t* config = nullptr;
  check_ucs(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  // Over TCP a large message goes as a rendezvous whose handshake (the
  // receiver's reply) waits behind the bulk data flowing the other way in the
  // same socket: with both directions busy (ZeRO's owners sending to each
  // other, a gather) a 1 Gbit/s link carried about half its rate each way.
  // Eager sends keep it full (tools/bench/wire_bound.sh; docs/performance.md).
  // A user's own UCX_RNDV_THRESH wins.
  if (std::getenv("UCX_RNDV_THRESH") == nullptr && tcp_only(std::getenv("UCX_TLS"))) {
    const ucs_status_t eager = ucp_config_modify(config, "RNDV_THRESH", "inf");
    if (eager != UCS_OK) ucp_config_release(config);
    check_ucs(eager, "ucp_config_modify(RNDV_THRESH)");
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  const ucs_status_t st = ucp_init(&params, config, &w.context);
  ucp_config_release(config);
  check_ucs(st, "ucp_init");
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // we lock around every call
  check_ucs(ucp_worker_create(w.context, &wp, &w.worker), "ucp_worker_create");
  if (ucp_worker_get_efd(w.worker, &w.event_fd) != UCS_OK) w.event_fd = -1;
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  check_ucs(ucp_worker_get_address(w.worker, &addr, &len), "ucp_worker_get_address");
  std::string blob = host_identity() + '\0';
  blob.append(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(w.worker, addr);
  return blob;
}

}  // namespace redco::comm::ucx_detail
