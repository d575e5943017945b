#include "redco/io/console.hpp"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>

#include "redco/core/allocator.hpp"
#include "redco/core/error.hpp"

namespace redco::io {
namespace {

double steady_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

bool stdout_is_terminal() {
  const char* term = std::getenv("TERM");
  return ::isatty(STDOUT_FILENO) && !(term && std::string_view(term) == "dumb");
}

// Columns of the terminal on stdout, 0 when unknown. A redrawn line longer
// than the terminal wraps, and '\r' then returns only to the wrapped part.
size_t terminal_columns() {
  winsize ws{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) != 0) return 0;
  return ws.ws_col;
}

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

std::string format_value(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return "0";
  double a = std::fabs(v);
  if (a >= 0.01 && a < 1e6) {
    int magnitude = static_cast<int>(std::floor(std::log10(a)));
    return fmt::format("{:.{}f}", v, std::max(0, 3 - magnitude));
  }
  return fmt::format("{:.1e}", v);
}

std::string format_si(double v) {
  if (!std::isfinite(v)) return format_value(v);
  static constexpr const char* kSuffix[] = {"", "k", "M", "G", "T"};
  int i = 0;
  // 999.5 rounds to "1000" at zero decimals: move to the next suffix instead.
  while (std::fabs(v) >= 999.5 && i < 4) {
    v /= 1000;
    ++i;
  }
  double a = std::fabs(v);
  int decimals = a < 9.995 ? 2 : a < 99.95 ? 1 : 0;
  return fmt::format("{:.{}f}{}", v, decimals, kSuffix[i]);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(std::llround(seconds));
  int64_t h = s / 3600, m = s % 3600 / 60, sec = s % 60;
  return h > 0 ? fmt::format("{}:{:02}:{:02}", h, m, sec) : fmt::format("{}:{:02}", m, sec);
}

MemoryStats memory_stats() {
  MemoryStats m;
  m.allocator_peak_bytes = CachingAllocator::cpu().stats().peak_bytes_in_use;
  rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) == 0) {
    m.max_rss_bytes = static_cast<size_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
  }
  return m;
}

std::optional<double> StepStats::mfu() const {
  if (flops_per_item <= 0 || peak_flops <= 0 || seconds <= 0) return std::nullopt;
  return items_per_s() * flops_per_item / peak_flops;
}

void StepStats::append_to(Metrics& m, std::string_view what, bool memory) const {
  m.emplace_back(fmt::format("{}_per_s", what), items_per_s());
  if (auto u = mfu()) m.emplace_back("mfu", *u);
  if (!memory) return;
  MemoryStats ms = memory_stats();
  m.emplace_back("alloc_peak_mib", static_cast<double>(ms.allocator_peak_bytes) / kMiB);
  m.emplace_back("max_rss_mib", static_cast<double>(ms.max_rss_bytes) / kMiB);
}

StepTimer::StepTimer() : last_(steady_seconds()) {}

double StepTimer::lap() {
  double now = steady_seconds();
  double dt = now - last_;
  last_ = now;
  return dt;
}

ProgressBar::ProgressBar(int64_t total_steps, std::string label, ProgressOptions opt)
    : total_(total_steps), label_(std::move(label)), opt_(std::move(opt)) {
  REDCO_CHECK(opt_.bar_width >= 0, "ProgressBar '{}': bar_width must be >= 0, got {}", label_,
              opt_.bar_width);
  if (!opt_.clock) opt_.clock = steady_seconds;
  out_ = opt_.out ? opt_.out : &std::cout;
  interactive_ = opt_.interactive.value_or(out_ == &std::cout && stdout_is_terminal());
  if (opt_.plain_every > 0) {
    every_ = opt_.plain_every;
  } else {
    every_ = total_ > 0 ? std::max<int64_t>(1, (total_ + 19) / 20) : 100;
  }
  created_ = opt_.clock();
}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(int64_t step, const Metrics& metrics, double items_per_step,
                         std::string_view unit) {
  if (finished_) return;
  double now = opt_.clock();
  if (!started_) {
    started_ = true;
    t0_ = now;
    step0_ = step;
    last_draw_ = -std::numeric_limits<double>::infinity();
  }
  step_ = step;
  last_t_ = now;
  metrics_ = metrics;
  items_per_step_ = items_per_step;
  unit_ = unit;
  bool last = total_ > 0 && step >= total_;
  if (interactive_) {
    if (last || now - last_draw_ >= opt_.min_redraw_s) draw();
  } else if ((step == step0_ || step % every_ == 0 || last) && step != last_plain_) {
    draw();
  }
}

void ProgressBar::print_line(std::string_view line) {
  bool bar_on_screen = interactive_ && drawn_ && !finished_;
  if (bar_on_screen) emit("\r\x1b[K");
  emit(line);
  emit("\n");
  if (bar_on_screen) draw();  // the bar moves below the printed line
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (!started_) return;
  if (interactive_) {
    draw();  // the last update may have been skipped by the redraw limit
    emit("\n");
  } else if (last_plain_ != step_) {
    draw();
  }
}

std::string ProgressBar::render() const {
  std::string s = label_.empty() ? "" : label_ + "  ";
  if (total_ > 0) {
    int64_t w = opt_.bar_width;
    int64_t filled = std::clamp<int64_t>(step_ * w / total_, 0, w);
    s += fmt::format("{}/{} [{}{}]", step_, total_, std::string(filled, '#'),
                     std::string(w - filled, '.'));
  } else {
    s += fmt::format("{}", step_);
  }
  for (const auto& [name, value] : metrics_) s += fmt::format(" {} {}", name, format_value(value));
  double steps_per_s = 0;
  if (step_ > step0_ && last_t_ > t0_) {
    steps_per_s = static_cast<double>(step_ - step0_) / (last_t_ - t0_);
    bool items = items_per_step_ > 0;
    s += fmt::format(" {} {}/s", format_si(items ? steps_per_s * items_per_step_ : steps_per_s),
                     items ? unit_ : "it");
  }
  if (total_ > 0 && step_ >= total_) {
    s += " elapsed " + format_duration(last_t_ - created_);
  } else if (total_ > 0 && steps_per_s > 0) {
    s += " ETA " + format_duration(static_cast<double>(total_ - step_) / steps_per_s);
  }
  return s;
}

void ProgressBar::draw() {
  std::string line = render();
  if (!interactive_) {
    emit(line + "\n");
    last_plain_ = step_;
    return;
  }
  size_t cols = out_ == &std::cout ? terminal_columns() : 0;
  if (cols > 1 && line.size() >= cols) line.resize(cols - 1);
  emit("\r" + line + "\x1b[K");  // clear what a longer previous line left behind
  drawn_ = true;
  last_draw_ = last_t_;
}

void ProgressBar::emit(std::string_view text) {
  out_->write(text.data(), static_cast<std::streamsize>(text.size()));
  out_->flush();  // progress must show now, not when a buffer fills
}

}  // namespace redco::io
