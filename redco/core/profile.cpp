#include "redco/core/profile.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>

#include "redco/core/allocator.hpp"
#include "redco/core/profile_sync.hpp"

namespace redco {

namespace profile {
namespace {
using Clock = std::chrono::steady_clock;
struct Frame {
  std::string path;
  Clock::time_point start;
  double nested = 0;      // seconds spent in scopes opened inside this one
  size_t peak_start = 0;  // the allocator's high-water mark when the scope opened
};
struct Totals {
  std::mutex mu;
  std::map<std::string, Entry> by_path;
  MemoryPeak peak;
};
Totals& totals() {
  static Totals t;
  return t;
}
thread_local std::vector<Frame> t_stack;  // this thread's open scopes, innermost last
std::atomic<void (*)()> g_device_sync{nullptr};
void sync_device() {
  if (auto* f = g_device_sync.load(std::memory_order_relaxed)) f();
}
}  // namespace

void set_device_sync(void (*sync)()) { g_device_sync.store(sync); }

void enable(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

void reset() {
  std::lock_guard lock(totals().mu);
  totals().by_path.clear();
  totals().peak = {};
}

MemoryPeak memory_peak() {
  std::lock_guard lock(totals().mu);
  return totals().peak;
}

std::vector<Entry> report() {
  std::vector<Entry> out;
  {
    std::lock_guard lock(totals().mu);
    for (const auto& [path, e] : totals().by_path) out.push_back(e);
  }
  std::sort(out.begin(), out.end(),
            [](const Entry& a, const Entry& b) { return a.seconds > b.seconds; });
  return out;
}

void Scope::begin(const char* name, const char* suffix) {
  sync_device();  // what was queued before belongs to the enclosing scope
  std::string path = t_stack.empty() ? std::string() : t_stack.back().path + " > ";
  path += name;
  if (suffix) path += suffix;
  const size_t peak = CachingAllocator::cpu().stats().peak_bytes_in_use;
  // A mark that rose since the enclosing scope last looked rose in that scope's
  // own code, between its children (or outside every scope).
  const size_t seen = t_stack.empty() ? 0 : t_stack.back().peak_start;
  if (peak > seen) {
    std::lock_guard lock(totals().mu);
    if (peak > totals().peak.bytes)
      totals().peak = {t_stack.empty() ? "(outside profiled scopes)" : t_stack.back().path, peak};
    if (!t_stack.empty()) t_stack.back().peak_start = peak;
  }
  t_stack.push_back({std::move(path), Clock::now(), 0, peak});
}

void Scope::end() {
  sync_device();
  Frame f = std::move(t_stack.back());
  t_stack.pop_back();
  const double s = std::chrono::duration<double>(Clock::now() - f.start).count();
  if (!t_stack.empty()) t_stack.back().nested += s;
  // Nested scopes end first, so the innermost one that saw the mark rise
  // claims it; outer scopes see no new rise unless memory grew after it.
  const size_t peak = CachingAllocator::cpu().stats().peak_bytes_in_use;
  if (!t_stack.empty()) t_stack.back().peak_start = std::max(t_stack.back().peak_start, peak);
  std::lock_guard lock(totals().mu);
  if (peak > f.peak_start && peak > totals().peak.bytes) totals().peak = {f.path, peak};
  Entry& e = totals().by_path[f.path];
  e.path = f.path;
  e.seconds += s - f.nested;
  e.calls += 1;
}
}  // namespace profile

}  // namespace redco
