#pragma once
// Console output for long work: a progress bar redrawn in place on a terminal
// (plain lines every N steps in CI logs), and the per-step numbers worth
// logging next to the loss: throughput, MFU and peak memory.
//
//   io::ProgressBar bar(1000, "train");
//   for (int64_t step = 1; step <= 1000; ++step) {
//     ...
//     bar.update(step, {{"loss", loss}, {"lr", lr}}, tokens_per_step, "tok");
//     if (step % 100 == 0) bar.print_line(fmt::format("eval  step {}  loss {:.4f}", step, l));
//   }
//   bar.finish();
//
//   train  42/1000 [#.............................] loss 1.234 lr 3.0e-04 12.3k tok/s ETA 1:23
//
// Anything else printed to the same stream while the bar is drawn ends up
// mid-line: print through print_line(), which clears the bar first.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>

#include "redco/io/events.hpp"

namespace redco::io {

// Number formats used on the bar (public for tests and for callers' own lines).
// About four significant digits in plain notation for 0.01 <= |v| < 1e6,
// otherwise one-decimal scientific: 1.234, 0.01234, 123457, 3.0e-04, nan.
std::string format_value(double v);
// Three significant digits with k/M/G/T suffixes: 950, 12.3k, 1.20M.
std::string format_si(double v);
// m:ss below an hour, h:mm:ss above; "?" when not finite or negative.
std::string format_duration(double seconds);

struct MemoryStats {
  size_t allocator_peak_bytes = 0;  // CachingAllocator::cpu() high-water mark of bytes in use
  size_t max_rss_bytes = 0;         // the process's peak resident set size (getrusage)
};
MemoryStats memory_stats();

// Throughput of one step or a window of steps.
struct StepStats {
  double seconds = 0;         // wall time taken
  double items = 0;           // examples or tokens processed in that time
  double flops_per_item = 0;  // model FLOPs per item (e.g. ~6 * parameters per token); 0: unknown
  // Peak FLOP/s of the hardware. There is no reliable way to compute it (it
  // depends on the ISA, clocks under load, dtype), so it is the user's to give;
  // 0 means unknown and MFU is not reported.
  double peak_flops = 0;

  double items_per_s() const { return seconds > 0 ? items / seconds : 0.0; }
  // Model FLOP utilisation, achieved model FLOP/s over peak, in [0, 1] for a
  // correct FLOP count; nullopt unless flops_per_item and peak_flops are set.
  std::optional<double> mfu() const;
  // Appends "<what>_per_s" (what = "tokens" gives tokens_per_s), "mfu" when
  // known and, if `memory`, "alloc_peak_mib" and "max_rss_mib" (memory_stats()).
  void append_to(Metrics& m, std::string_view what, bool memory = true) const;
};

// Wall time between laps on a monotonic clock.
class StepTimer {
 public:
  StepTimer();
  double lap();  // seconds since construction or the previous lap
 private:
  double last_;
};

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct ProgressOptions {
  std::ostream* out = nullptr;  // nullptr: std::cout
  // Redraw in place with '\r' (a terminal) or print plain lines (a log file).
  // Unset: in place exactly when `out` is std::cout and stdout is a terminal.
  std::optional<bool> interactive{};
  int64_t plain_every = 0;    // plain mode: a line every N steps; 0: about 20 per run
  double min_redraw_s = 0.1;  // in-place mode: at most ~10 redraws per second
  int bar_width = 30;
  std::function<double()> clock{};  // monotonic seconds; unset: steady_clock (tests inject one)
};

class ProgressBar {
 public:
  // total_steps <= 0: unknown length, shown without bar and ETA.
  ProgressBar(int64_t total_steps, std::string label, ProgressOptions opt = {});
  ~ProgressBar();  // finish()
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `step` steps are done. Rates and ETA are averaged from the first update()
  // on, so a slow first step (warm-up, allocation) does not skew them.
  // items_per_step > 0 shows "<items/s> <unit>/s", otherwise steps per second.
  void update(int64_t step, const Metrics& metrics = {}, double items_per_step = 0,
              std::string_view unit = "it");
  // A full line (e.g. evaluation results) above the bar.
  void print_line(std::string_view line);
  // Leaves the final state on its own line; later update()s are ignored.
  void finish();

  // The line as drawn now, without '\r' or newline.
  std::string render() const;

 private:
  void draw();
  void emit(std::string_view text);

  int64_t total_;
  std::string label_;
  ProgressOptions opt_;
  std::ostream* out_;
  bool interactive_;
  int64_t every_;
  double created_;
  bool started_ = false, finished_ = false, drawn_ = false;
  double t0_ = 0, last_t_ = 0, last_draw_ = 0;
  int64_t step0_ = 0, step_ = 0, last_plain_ = -1;
  Metrics metrics_;
  double items_per_step_ = 0;
  std::string unit_ = "it";
};

}  // namespace redco::io
