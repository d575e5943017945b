#pragma once
// A line plot as a self-contained SVG file: curves of a training run (an RL
// agent's episode returns, a loss) that any browser shows, with no plotting
// package needed.
//
//   io::write_line_plot(workdir / "returns.svg",
//                       {{.name = "mean return", .x = steps, .y = returns}},
//                       {.title = "PPO on CartPole-v1", .x_label = "env steps",
//                        .y_label = "return"});
//
// Layout: the plot area is the frame [kLeft, width - kRight] x [kTop,
// height - kBottom] in SVG pixels; x grows right, y up (so a larger value
// has a smaller SVG y). Axis ranges are the data's minimum and maximum over
// every series, widened to a unit around a single value; five ticks per
// axis, labelled with 4 significant digits. Each series is one <polyline> (points "x,y ..."
// with two decimals), coloured from a fixed palette, named in a legend.
// Text is XML-escaped.
#include <filesystem>
#include <string>
#include <vector>

namespace redco::io {

struct PlotSeries {
  std::string name = {};
  std::vector<double> x = {};  // x and y: the same length, >= 1 points, finite
  std::vector<double> y = {};
};

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct PlotOptions {
  std::string title = {};
  std::string x_label = {};
  std::string y_label = {};
  int width = 720, height = 420;  // pixels, >= 200 each
};

// Margins of the plot area, in pixels.
inline constexpr double kPlotLeft = 70, kPlotRight = 20, kPlotTop = 40, kPlotBottom = 50;

// The SVG document. Series of unequal length, empty or with a non-finite
// value, no series, or a size below 200 pixels are a redco::Error naming it.
std::string line_plot_svg(const std::vector<PlotSeries>& series, const PlotOptions& options);
// The same, written to `path` (replaced whole: written beside it, then renamed).
void write_line_plot(const std::filesystem::path& path, const std::vector<PlotSeries>& series,
                     const PlotOptions& options);

}  // namespace redco::io
