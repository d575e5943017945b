// io::line_plot_svg parsed back: the document is well-formed XML (a small
// parser below checks tag nesting and quoted attributes), each series is a
// polyline whose points map the data linearly onto the plot area (the
// extremes onto its edges), text is escaped, and bad input is one error.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "redco/core/error.hpp"
#include "svg_plot.hpp"

using namespace redco;

namespace {

struct Element {
  std::string tag, text;
  std::map<std::string, std::string> attrs;
};

// Every element in document order; fails the test on malformed XML.
std::vector<Element> parse_xml(const std::string& s) {
  std::vector<Element> out;
  std::vector<std::string> open;
  size_t i = 0;
  while ((i = s.find('<', i)) != std::string::npos) {
    const size_t end = s.find('>', i);
    REQUIRE(end != std::string::npos);
    std::string body = s.substr(i + 1, end - i - 1);
    if (body[0] == '/') {
      REQUIRE(!open.empty());
      CHECK(open.back() == body.substr(1));
      open.pop_back();
      i = end + 1;
      continue;
    }
    const bool self_closing = body.back() == '/';
    if (self_closing) body.pop_back();
    Element e;
    size_t p = body.find_first_of(" \n");
    e.tag = body.substr(0, p);
    while (p != std::string::npos && (p = body.find_first_not_of(" \n", p)) != std::string::npos) {
      const size_t eq = body.find('=', p);
      REQUIRE(eq != std::string::npos);
      REQUIRE(body[eq + 1] == '"');
      const size_t close = body.find('"', eq + 2);
      REQUIRE(close != std::string::npos);
      e.attrs[body.substr(p, eq - p)] = body.substr(eq + 2, close - eq - 2);
      p = close + 1;
    }
    if (!self_closing) {
      open.push_back(e.tag);
      const size_t next = s.find('<', end);
      e.text = s.substr(end + 1, next - end - 1);
    }
    out.push_back(std::move(e));
    i = end + 1;
  }
  CHECK(open.empty());
  return out;
}

std::vector<std::pair<double, double>> points(const std::string& attr) {
  std::vector<std::pair<double, double>> out;
  std::istringstream in(attr);
  std::string pair;
  while (in >> pair) {
    const size_t comma = pair.find(',');
    out.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
  }
  return out;
}

}  // namespace

TEST_CASE("line plot: the polylines map the data onto the plot area", "[svg]") {
  const io::PlotSeries a{.name = "mean <return>", .x = {0, 10, 20, 40}, .y = {-5, 0, 15, 10}};
  const io::PlotSeries b{.name = "b & c", .x = {5, 30}, .y = {1, 2}};
  const std::string svg = io::line_plot_svg({a, b}, {.title = "PPO \"CartPole\"",
                                                     .x_label = "steps",
                                                     .y_label = "return",
                                                     .width = 400,
                                                     .height = 300});
  const std::vector<Element> doc = parse_xml(svg);
  REQUIRE(doc.front().tag == "svg");
  CHECK(doc.front().attrs.at("width") == "400");
  std::vector<Element> lines;
  std::vector<std::string> texts;
  for (const Element& e : doc) {
    if (e.tag == "polyline") lines.push_back(e);
    if (e.tag == "text") texts.push_back(e.text);
  }
  REQUIRE(lines.size() == 2);
  // x in [0, 40] onto [70, 380], y in [-5, 15] onto [250, 40] (y grows up).
  const double x0 = io::kPlotLeft, x1 = 400 - io::kPlotRight, y0 = io::kPlotTop,
               y1 = 300 - io::kPlotBottom;
  const auto pa = points(lines[0].attrs.at("points")), pb = points(lines[1].attrs.at("points"));
  REQUIRE(pa.size() == 4);
  REQUIRE(pb.size() == 2);
  for (size_t i = 0; i < 4; ++i) {
    CHECK(pa[i].first == Approx(x0 + a.x[i] / 40 * (x1 - x0)).margin(0.006));
    CHECK(pa[i].second == Approx(y1 - (a.y[i] + 5) / 20 * (y1 - y0)).margin(0.006));
  }
  CHECK(pa[0].first == Approx(x0).margin(0.006));   // the smallest x on the left edge
  CHECK(pa[3].first == Approx(x1).margin(0.006));   // the largest on the right one
  CHECK(pa[2].second == Approx(y0).margin(0.006));  // the largest y at the top
  CHECK(pb[0].second == Approx(y1 - 6.0 / 20 * (y1 - y0)).margin(0.006));
  CHECK(lines[0].attrs.at("stroke") != lines[1].attrs.at("stroke"));
  // Escaped text, as written: the parser above reads it back verbatim.
  CHECK(std::find(texts.begin(), texts.end(), "PPO &quot;CartPole&quot;") != texts.end());
  CHECK(std::find(texts.begin(), texts.end(), "mean &lt;return&gt;") != texts.end());
  CHECK(std::find(texts.begin(), texts.end(), "b &amp; c") != texts.end());
  CHECK(std::find(texts.begin(), texts.end(), "-5") != texts.end());  // the y ticks
  CHECK(std::find(texts.begin(), texts.end(), "15") != texts.end());
}

TEST_CASE("line plot: a single point gets an axis; the file is written whole", "[svg]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("redco-svg-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  io::write_line_plot(dir / "one.svg", {{.name = "r", .x = {3}, .y = {7}}}, {.title = "one"});
  std::ifstream f(dir / "one.svg");
  const std::string svg((std::istreambuf_iterator<char>(f)), {});
  const auto doc = parse_xml(svg);
  for (const Element& e : doc)
    if (e.tag == "polyline") {
      const auto p = points(e.attrs.at("points"));
      REQUIRE(p.size() == 1);
      CHECK(p[0].first == Approx((io::kPlotLeft + 720 - io::kPlotRight) / 2).margin(0.006));
    }
  CHECK_FALSE(std::filesystem::exists(dir / "one.svg.tmp"));
  CHECK_THROWS_WITH(io::write_line_plot(dir / "missing" / "x.svg", {{"r", {1}, {1}}}, {}),
                    Catch::Contains("cannot write"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("line plot: bad series are one clear error", "[svg]") {
  CHECK_THROWS_WITH(io::line_plot_svg({}, {.title = "t"}), Catch::Contains("no series"));
  CHECK_THROWS_WITH(io::line_plot_svg({{"s", {1, 2}, {1}}}, {}),
                    Catch::Contains("series 's' has 2 x and 1 y values"));
  CHECK_THROWS_WITH(io::line_plot_svg({{"s", {1}, {NAN}}}, {}), Catch::Contains("not finite"));
  CHECK_THROWS_WITH(io::line_plot_svg({{"s", {1}, {1}}}, {.width = 100}),
                    Catch::Contains(">= 200 pixels"));
}
