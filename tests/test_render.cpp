// Text lines rendered with FreeType (data::render_line): where the ink falls
// against the font's own metrics, offsets as exact pixel shifts, widths that
// grow with the text, deterministic noise, and the errors. Skips (77) without
// FreeType or Debian's fonts-dejavu-core / fonts-liberation.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "redco/core/error.hpp"
#include "datasets/render.hpp"
#include "skip.hpp"

using namespace redco;
using Catch::Matchers::Contains;

namespace {

const char* kSans = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const char* kSerif = "/usr/share/fonts/truetype/liberation/LiberationSerif-Regular.ttf";

data::Font open_or_skip(const char* file) {
  if (!data::have_freetype()) test::skip("redco built without FreeType (libfreetype-dev)");
  if (!std::filesystem::exists(file))
    test::skip(std::string(file) + " missing (Debian fonts-dejavu-core, fonts-liberation)");
  return data::Font(file);
}

struct Bounds {
  int64_t top = -1, bottom = -1, left = -1, right = -1;  // inclusive; -1: no ink
};

// The rows/columns holding a pixel above `level`.
Bounds ink_bounds(const Tensor& img, float level = 0.25f) {
  const int64_t h = img.shape()[0], w = img.shape()[1];
  const float* p = img.data<float>();
  Bounds b;
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      if (p[y * w + x] > level) {
        if (b.top < 0) b.top = y;
        b.bottom = y;
        b.left = b.left < 0 ? x : std::min(b.left, x);
        b.right = std::max(b.right, x);
      }
  return b;
}

bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.values<float>() == b.values<float>();
}

}  // namespace

TEST_CASE("a capital sits on the baseline, a descender goes below it", "[render]") {
  data::Font sans = open_or_skip(kSans);
  // DejaVu Sans: ascender 0.928 em, cap height 0.729 em, H 0.752 em wide with
  // 0.098 em side bearings. At 40 px the baseline is row ceil(37.1) = 38.
  const data::LineStyle st{.size = 40.f};
  const Bounds h = ink_bounds(data::render_line(sans, "H", st, 56, 48));
  CHECK(h.bottom == 37);                              // the last row above the baseline
  CHECK(std::abs(h.top - (38 - 29)) <= 1);            // 0.729 * 40 = 29.2 rows tall
  CHECK(std::abs(h.left - 4) <= 1);                   // 0.098 * 40 = 3.9
  CHECK(std::abs((h.right - h.left + 1) - 22) <= 1);  // (0.752 - 2 * 0.098) * 40 = 22.2
  const Bounds g = ink_bounds(data::render_line(sans, "g", st, 56, 48));
  CHECK(g.bottom > 38 + 5);  // the descender, 0.236 em below the baseline at most
  CHECK(g.bottom <= 38 + 10);
  const Bounds a = ink_bounds(data::render_line(sans, "a", st, 56, 48));
  CHECK(a.bottom <= 38);  // x-height letters end at the baseline (round overshoot: 1 row)
  CHECK(a.top > h.top + 5);
  // Ink is coverage: within [0, 1], with anti-aliased grey at the edges.
  for (float v : data::render_line(sans, "Hag", st, 56, 80).values<float>()) {
    REQUIRE(v >= 0.f);
    REQUIRE(v <= 1.f);
  }
}

TEST_CASE("offsets shift the line by whole pixels", "[render]") {
  data::Font serif = open_or_skip(kSerif);
  const Tensor base = data::render_line(serif, "Jonah 1:17", {.size = 14.f}, 24, 100);
  const Tensor moved =
      data::render_line(serif, "Jonah 1:17", {.size = 14.f, .x = 5.f, .y = 3.f}, 24, 100);
  const float* p = base.data<float>();
  const float* q = moved.data<float>();
  double ink = 0;
  for (int64_t y = 0; y < 24; ++y)
    for (int64_t x = 0; x < 100; ++x) {
      const float want = y >= 3 && x >= 5 ? p[(y - 3) * 100 + (x - 5)] : 0.f;
      REQUIRE(q[y * 100 + x] == want);
      ink += want;
    }
  CHECK(ink > 20);  // there is text to compare
  const Bounds b = ink_bounds(moved);
  CHECK(b.top >= 3);
  CHECK(b.left >= 5);
}

TEST_CASE("width follows the text: fitted images grow, advances add up", "[render]") {
  data::Font sans = open_or_skip(kSans);
  float last = 0;
  for (const char* t : {"I", "In", "In the", "In the beginning"}) {
    const float adv = data::line_advance(sans, t, 16.f);
    CHECK(adv > last);
    last = adv;
    const Tensor img = data::render_line(sans, t, {.size = 16.f, .x = 2.f}, 20);
    CHECK(img.shape()[1] == int64_t(std::ceil(2.f + adv)) + 1);
    CHECK(ink_bounds(img).right < img.shape()[1]);
    CHECK(ink_bounds(img).right >= int64_t(adv) - 3);  // the last glyph's ink is near the end
  }
  // A larger size is wider in proportion (hinting moves it by a pixel or so).
  const float small = data::line_advance(sans, "In the beginning", 12.f);
  const float big = data::line_advance(sans, "In the beginning", 24.f);
  CHECK(std::abs(big / small - 2.f) < 0.1f);
  // Text past the width is clipped, not an error.
  const Tensor clipped =
      data::render_line(sans, "In the beginning God created", {.size = 16}, 20, 30);
  CHECK(clipped.shape() == Shape{20, 30});
}

TEST_CASE("noise is deterministic from the seed; text and font change the image", "[render]") {
  data::Font sans = open_or_skip(kSans);
  data::Font serif = open_or_skip(kSerif);
  const data::LineStyle st{.size = 14.f, .x = 1.f, .y = 2.f, .noise = 0.2f, .seed = 11};
  const Tensor a = data::render_line(sans, "the light", st, 24, 90);
  CHECK(same(a, data::render_line(sans, "the light", st, 24, 90)));
  data::LineStyle other = st;
  other.seed = 12;
  const Tensor b = data::render_line(sans, "the light", other, 24, 90);
  CHECK_FALSE(same(a, b));
  CHECK_FALSE(same(a, data::render_line(sans, "the night", st, 24, 90)));
  CHECK_FALSE(same(a, data::render_line(serif, "the light", st, 24, 90)));
  // The noise is what it says: image minus clean ink has the requested spread.
  data::LineStyle clean = st;
  clean.noise = 0.f;
  const auto ink = data::render_line(sans, "the light", clean, 24, 90).values<float>();
  const auto noisy = a.values<float>();
  double sum = 0, sq = 0;
  for (size_t k = 0; k < ink.size(); ++k) {
    const double d = noisy[k] - ink[k];
    sum += d;
    sq += d * d;
  }
  const double n = double(ink.size()), mean = sum / n;
  CHECK(std::abs(mean) < 0.02);
  CHECK(std::abs(std::sqrt(sq / n - mean * mean) - 0.2) < 0.02);
}

TEST_CASE("render errors name the font or the value", "[render]") {
  data::Font sans = open_or_skip(kSans);
  CHECK_THROWS_WITH(data::Font("/nonexistent/Font.ttf"),
                    Contains("/nonexistent/Font.ttf") && Contains("fonts-dejavu-core"));
  const std::string junk =
      (std::filesystem::temp_directory_path() / ("redco_render_" + std::to_string(getpid())))
          .string();
  std::ofstream(junk) << "not a font";
  CHECK_THROWS_WITH(data::Font(junk), Contains(junk) && Contains("cannot read"));
  std::filesystem::remove(junk);
  CHECK_THROWS_WITH(data::render_line(sans, "x", {.size = 0.f}, 8, 8), Contains("font size"));
  CHECK_THROWS_WITH(data::render_line(sans, "x", {.noise = -1.f}, 8, 8), Contains("noise"));
  CHECK_THROWS_WITH(data::render_line(sans, "x", {}, 0, 8), Contains("image size"));
  // Malformed UTF-8 still renders (as replacement characters).
  CHECK(ink_bounds(data::render_line(sans, "a\xff\xfe b", {.size = 12.f}, 16, 60)).right > 0);
}

TEST_CASE("wrap_words cuts at spaces within the width", "[render]") {
  using V = std::vector<std::string>;
  CHECK(data::wrap_words("In the beginning God created", 12) ==
        V{"In the", "beginning", "God created"});
  CHECK(data::wrap_words("  a  b ", 3) == V{"a b"});
  CHECK(data::wrap_words("Mahershalalhashbaz came", 8) == V{"Mahersha", "came"});  // cut word
  CHECK(data::wrap_words("", 5).empty());
  for (const std::string& l :
       data::wrap_words("And God said, Let there be light: and there was light.", 10))
    CHECK(l.size() <= 10);
  CHECK_THROWS_WITH(data::wrap_words("x", 0), Contains("max_chars"));
}

TEST_CASE("draw_style stays in its ranges and depends on (seed, key) only", "[render]") {
  const data::StyleRange r{
      .min_size = 10.f, .max_size = 14.f, .max_x = 3.f, .max_y = 2.f, .max_noise = 0.2f};
  std::vector<int> fonts(3, 0);
  double size_sum = 0;
  for (uint64_t key = 0; key < 600; ++key) {
    const data::DrawnStyle d = data::draw_style(r, 3, 7, key);
    REQUIRE(d.style.size >= 10.f);
    REQUIRE(d.style.size <= 14.f);
    REQUIRE((d.style.x >= 0.f && d.style.x <= 3.f && d.style.y >= 0.f && d.style.y <= 2.f));
    REQUIRE((d.style.noise >= 0.f && d.style.noise <= 0.2f));
    REQUIRE(d.font < 3);
    ++fonts[d.font];
    size_sum += d.style.size;
  }
  for (int n : fonts) CHECK(n > 150);            // each font about a third of the time
  CHECK(std::abs(size_sum / 600 - 12.0) < 0.2);  // uniform: mean at the middle
  const auto a = data::draw_style(r, 3, 7, 5), b = data::draw_style(r, 3, 7, 5);
  CHECK((a.style.size == b.style.size && a.style.seed == b.style.seed && a.font == b.font));
  CHECK(data::draw_style(r, 3, 8, 5).style.size != a.style.size);
  CHECK(data::draw_style(r, 3, 7, 6).style.seed != a.style.seed);
  CHECK_THROWS_WITH(data::draw_style({.min_size = 5.f, .max_size = 4.f}, 3, 7, 0),
                    Contains("min_size"));
}
