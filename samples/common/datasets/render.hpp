#pragma once
// Text lines rendered into grayscale images with FreeType: the input side of
// reading text from images (OCR-style pipelines), synthesised from any text
// corpus with a choice of fonts, sizes, offsets and noise.
//
//   data::Font serif("/usr/share/fonts/truetype/liberation/LiberationSerif-Regular.ttf");
//   Tensor img = data::render_line(serif, "In the beginning", {.size = 14, .x = 2, .y = 1,
//                                  .noise = 0.1f, .seed = 7}, 24, 160);   // [24, 160] f32
//
// Ink is 1 and paper 0 (FreeType's anti-aliased coverage, 0..1), plus
// Gaussian noise of standard deviation `noise` drawn from Philox keyed by
// `seed`, so an image depends on (font, text, style) alone. Glyphs that fall
// outside the image are clipped; a width of 0 makes the image as wide as the
// text needs. Text is UTF-8; characters the font lacks draw its .notdef box.
//
// FreeType is optional (Debian libfreetype-dev): without it have_freetype()
// is false and opening a Font throws an Error saying how to build with it.
// A Font is not thread-safe (FreeType faces are not): use one per thread.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "redco/core/tensor.hpp"

namespace redco::data {

// Whether this build of redco renders text (was built with FreeType).
bool have_freetype();

// One font file (TrueType/OpenType), opened once and reused for every size.
class Font {
 public:
  explicit Font(const std::filesystem::path& file);  // throws Error naming the file
  ~Font();
  Font(Font&&) noexcept;
  Font& operator=(Font&&) noexcept;
  const std::filesystem::path& file() const;
  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct LineStyle {
  float size = 16.f;  // pixels per em (a capital letter is ~0.7 of this tall)
  float x = 0.f;      // column of the first glyph's origin (whole pixels: rounded)
  float y = 0.f;      // row of the top of the line (the font's ascender) (rounded)
  float noise = 0.f;  // standard deviation of the additive Gaussian noise
  uint64_t seed = 0;  // the noise's Philox key
};

// How many pixels the line advances from its first origin to its end at
// `size` (kerning included): an image of width ceil(x + advance) holds it.
float line_advance(const Font& font, std::string_view text, float size);

// The line as a [height, width] f32 image (width 0: ceil(x + advance) + 1).
Tensor render_line(const Font& font, std::string_view text, const LineStyle& style, int64_t height,
                   int64_t width = 0);

// The same into out[height * width] (row-major), overwriting it: for filling a
// batch buffer in place.
void render_line_into(float* out, int64_t height, int64_t width, const Font& font,
                      std::string_view text, const LineStyle& style);

// Synthetic data: a style drawn uniformly from these ranges (size in
// [min_size, max_size], x in [0, max_x], y in [0, max_y], noise in
// [0, max_noise]), and one of `fonts` fonts, from Philox(seed, key): a line
// keyed by its index looks the same in every epoch and on every rank.
// Designated initialisers name these fields in the order declared below (C++20 rule).
struct StyleRange {
  float min_size = 10.f, max_size = 13.f;
  float max_x = 4.f, max_y = 2.f;
  float max_noise = 0.f;
};
struct DrawnStyle {
  LineStyle style;
  size_t font = 0;  // index into the fonts
};
DrawnStyle draw_style(const StyleRange& range, size_t fonts, uint64_t seed, uint64_t key);

// Text cut at spaces into lines of at most max_chars bytes (a longer word is
// cut at max_chars); runs of spaces separate words like one.
std::vector<std::string> wrap_words(std::string_view text, size_t max_chars);

}  // namespace redco::data
