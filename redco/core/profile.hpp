#pragma once
// Per-op wall-time profiling, shared by the kernels (redco/ops), the autodiff
// engine and the optimizers.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace redco {

// Per-op wall-time totals, off by default. Kernel entry points (ops/backend.hpp), backward
// rules (redco/autodiff) and optimizer steps open a profile::Scope; when
// profiling is off a scope costs one relaxed atomic load. Time is attributed
// exclusively to the innermost open scope and keyed by the path of open
// scopes ("linear.backward > matmul"), so the totals add up to the profiled
// wall time without double counting.
namespace profile {
struct Entry {
  std::string path;    // open scopes, outermost first, joined by " > "
  double seconds = 0;  // exclusive: time spent in nested scopes is not counted
  int64_t calls = 0;
};
inline std::atomic<bool> g_enabled{false};
inline bool enabled() { return g_enabled.load(std::memory_order_relaxed); }
void enable(bool on);
void reset();
std::vector<Entry> report();  // sorted by decreasing seconds
// Where the CPU allocator's bytes in use peaked while profiling: the innermost
// scope open when the high-water mark last rose, and that mark.
struct MemoryPeak {
  std::string path;  // empty: no scope raised the mark
  size_t bytes = 0;
};
MemoryPeak memory_peak();

class Scope {
 public:
  explicit Scope(const char* name) : active_(enabled()) {
    if (active_) begin(name, nullptr);
  }
  Scope(const char* name, const char* suffix) : active_(enabled()) {
    if (active_) begin(name, suffix);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  ~Scope() {
    if (active_) end();
  }

 private:
  static void begin(const char* name, const char* suffix);
  static void end();
  bool active_;
};
}  // namespace profile

}  // namespace redco
