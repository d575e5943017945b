// ThreadsWorld (threads_comm.hpp): n ranks as threads of one process, and
// how a rank's failure, exit or silence ends what the others wait for.
#include <algorithm>
#include <thread>

#include "redco/comm/threads_state.hpp"
#include "redco/core/error.hpp"

namespace redco::comm {
namespace detail {

void fail_slot(Slot& s, const std::string& why, Waiters& wake) {
  if (!s.error.empty()) return;
  s.error = why;
  wake.insert(wake.end(), s.waiting.begin(), s.waiting.end());
  s.waiting.clear();
}

void fail_envelope(Envelope& e, const std::string& why, Waiters& wake) {
  if (e.sent || !e.waiting || !e.error.empty()) return;
  e.error = why;
  e.waiting = false;
  wake.push_back(e.receiver);
}

void fail_world(ThreadsState& st, const std::string& why, Waiters& wake) {
  if (st.failure.empty()) st.failure = why;
  for (auto& [key, g] : st.groups)
    for (auto& [seq, s] : g->slots) fail_slot(*s, st.failure, wake);
  for (auto& [key, e] : st.mail) fail_envelope(*e, st.failure, wake);
}

std::vector<int> missing(const Group& g, const Slot& s) {
  std::vector<int> out;
  for (size_t r = 0; r < g.members.size(); ++r)
    if (s.reached[r] <= s.phase) out.push_back(g.members[r]);
  return out;
}

void rank_exited(ThreadsState& st, int rank, Waiters& wake) {
  st.exited[size_t(rank)] = true;
  for (auto& [key, g] : st.groups)
    for (auto& [seq, s] : g->slots) {
      const std::vector<int> m = missing(*g, *s);
      if (std::find(m.begin(), m.end(), rank) != m.end())
        fail_slot(*s, fmt::format("rank {} exited before joining it", rank), wake);
    }
  for (auto& [key, e] : st.mail)
    if (e->src == rank)
      fail_envelope(*e, fmt::format("rank {} exited without sending it", rank), wake);
}

void check_timeouts(ThreadsState& st) {
  Waiters wake;
  {
    std::lock_guard lock(st.mutex);
    const Clock::time_point now = Clock::now();
    const double secs = std::chrono::duration<double>(st.options.timeout).count();
    for (auto& [key, g] : st.groups)
      for (auto& [seq, s] : g->slots)
        if (s->error.empty() && now - s->since > st.options.timeout)
          fail_slot(*s,
                    fmt::format("timed out after {:g} s: rank(s) {} never arrived", secs,
                                fmt::join(missing(*g, *s), ", ")),
                    wake);
    for (auto& [key, e] : st.mail)
      if (e->waiting && now - e->since > st.options.timeout)
        fail_envelope(
            *e, fmt::format("timed out after {:g} s: rank {} never sent it", secs, e->src), wake);
  }
  for (const sched::Waiter& w : wake) w.resume();
}

}  // namespace detail

namespace {

sched::ProgressEngine::Options watchdog_options(std::chrono::milliseconds timeout) {
  // Timeouts are checked every 1/20 of the timeout, within [1 ms, 100 ms].
  const auto every = std::clamp<std::chrono::microseconds>(
      timeout / 20, std::chrono::milliseconds(1), std::chrono::milliseconds(100));
  return {.idle_spins = 0, .max_sleep = every};
}

}  // namespace

ThreadsWorld::ThreadsWorld(int n, ThreadsOptions options) {
  REDCO_CHECK(n >= 1, "ThreadsWorld needs at least one rank, got {}", n);
  REDCO_CHECK(options.timeout.count() > 0, "ThreadsWorld: the timeout must be positive");
  state_ = std::make_shared<detail::ThreadsState>(n, options, watchdog_options(options.timeout));
  auto world = std::make_shared<detail::Group>();
  for (int r = 0; r < n; ++r) world->members.push_back(r);
  // The world is nobody's subgroup: a parent id no group has.
  state_->groups[{~uint64_t(0), world->members, 0}] = world;
  for (int r = 0; r < n; ++r) comms_.push_back(detail::make_threads_comm(state_, world, r));
  state_->watchdog.add([st = state_.get()] {
    detail::check_timeouts(*st);
    return false;  // never "busy": the engine sleeps its full interval between checks
  });
}

ThreadsWorld::~ThreadsWorld() = default;

Comm& ThreadsWorld::comm(int rank) {
  REDCO_CHECK(rank >= 0 && rank < size(), "ThreadsWorld of {} ranks has no rank {}", size(), rank);
  return *comms_[size_t(rank)];
}

void ThreadsWorld::fail(int rank, const std::string& why) {
  detail::Waiters wake;
  {
    std::lock_guard lock(state_->mutex);
    detail::fail_world(*state_, fmt::format("rank {} failed: {}", rank, why), wake);
  }
  for (const sched::Waiter& w : wake) w.resume();
}

void ThreadsWorld::exited(int rank) {
  detail::Waiters wake;
  {
    std::lock_guard lock(state_->mutex);
    detail::rank_exited(*state_, rank, wake);
  }
  for (const sched::Waiter& w : wake) w.resume();
}

void ThreadsWorld::run(const std::function<void(Comm&)>& fn) {
  {
    std::lock_guard lock(state_->mutex);
    state_->exited.assign(size_t(size()), false);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < size(); ++r)
    threads.emplace_back([this, &fn, r] {
      try {
        fn(*comms_[size_t(r)]);
        exited(r);
      } catch (const std::exception& e) {
        fail(r, e.what());
      } catch (...) {
        fail(r, "an exception that is not a std::exception");
      }
    });
  for (std::thread& t : threads) t.join();
  std::lock_guard lock(state_->mutex);
  if (!state_->failure.empty()) throw Error(state_->failure);
}

}  // namespace redco::comm
