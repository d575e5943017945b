// Text lines through FreeType (when built with it): each glyph rendered
// anti-aliased at the requested pixel size and blended (max) into the image at
// its bitmap offset from the pen, the pen moved by the glyph's advance plus
// kerning, in FreeType's 26.6 fixed point so that sub-pixel advances add up.
#include "datasets/render.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/core/philox.hpp"

#ifdef REDCO_HAVE_FREETYPE
#include <ft2build.h>
#include FT_FREETYPE_H
#endif

namespace redco::data {
#ifdef REDCO_HAVE_FREETYPE

namespace {

// The next code point of UTF-8 text from s[i] (advancing i); malformed bytes
// read as U+FFFD so a bad line still renders.
char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b = uint8_t(s[i++]);
  if (b < 0x80) return b;
  const int n = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : -1;
  if (n < 0) return 0xFFFD;
  char32_t c = b & (0x3F >> n);
  for (int k = 0; k < n; ++k) {
    if (i >= s.size() || (uint8_t(s[i]) & 0xC0) != 0x80) return 0xFFFD;
    c = (c << 6) | (uint8_t(s[i++]) & 0x3F);
  }
  return c;
}

}  // namespace

bool have_freetype() { return true; }

struct Font::Impl {
  std::filesystem::path file;
  FT_Library library = nullptr;
  FT_Face face = nullptr;
  float size = -1.f;  // the pixel size the face is set to

  ~Impl() {
    if (face) FT_Done_Face(face);
    if (library) FT_Done_FreeType(library);
  }
  void set_size(float px) {
    if (px == size) return;
    REDCO_CHECK(px > 0.f && px <= 1000.f, "render_line: font size {} px is out of (0, 1000]", px);
    // 26.6 fixed point at 72 dpi: one point is one pixel.
    if (FT_Set_Char_Size(face, 0, FT_F26Dot6(std::lround(px * 64.f)), 72, 72) != 0)
      fail("font {}: cannot be set to {} px (a bitmap-only font has fixed sizes)", file.string(),
           px);
    size = px;
  }
  FT_UInt glyph(char32_t c) const { return FT_Get_Char_Index(face, FT_ULong(c)); }
  FT_Pos kerning(FT_UInt left, FT_UInt right) const {
    if (!left || !FT_HAS_KERNING(face)) return 0;
    FT_Vector k{0, 0};
    FT_Get_Kerning(face, left, right, FT_KERNING_UNFITTED, &k);
    return k.x;
  }
};

Font::Font(const std::filesystem::path& file) : impl_(std::make_unique<Impl>()) {
  impl_->file = file;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec))
    fail(
        "font {}: no such file (Debian packages fonts-dejavu-core and fonts-liberation put "
        "fonts in /usr/share/fonts/truetype/)",
        file.string());
  if (FT_Init_FreeType(&impl_->library) != 0) fail("FreeType failed to initialise");
  if (FT_New_Face(impl_->library, file.c_str(), 0, &impl_->face) != 0)
    fail("font {}: FreeType cannot read it (not a TrueType/OpenType font file?)", file.string());
  if (!FT_IS_SCALABLE(impl_->face))
    fail("font {}: not scalable (a bitmap font); use a TrueType/OpenType outline font",
         file.string());
}

float line_advance(const Font& font, std::string_view text, float size) {
  Font::Impl& f = font.impl();
  f.set_size(size);
  FT_Pos pen = 0;  // 26.6
  FT_UInt prev = 0;
  for (size_t i = 0; i < text.size();) {
    const FT_UInt g = f.glyph(next_code_point(text, i));
    pen += f.kerning(prev, g);
    if (FT_Load_Glyph(f.face, g, FT_LOAD_DEFAULT) != 0)
      fail("font {}: cannot load glyph {}", f.file.string(), g);
    pen += f.face->glyph->advance.x;
    prev = g;
  }
  return float(pen) / 64.f;
}

namespace {

// Blends an 8-bit coverage bitmap into out[height, width] with its top-left at (top, left).
void blend(float* out, int64_t height, int64_t width, const FT_Bitmap& bm, int64_t top,
           int64_t left) {
  for (int64_t r = 0; r < int64_t(bm.rows); ++r) {
    const int64_t y = top + r;
    if (y < 0 || y >= height) continue;
    const unsigned char* src = bm.buffer + r * bm.pitch;
    for (int64_t c = 0; c < int64_t(bm.width); ++c) {
      const int64_t x = left + c;
      if (x < 0 || x >= width) continue;
      float& px = out[y * width + x];
      px = std::max(px, float(src[c]) / 255.f);
    }
  }
}

}  // namespace

void render_line_into(float* out, int64_t height, int64_t width, const Font& font,
                      std::string_view text, const LineStyle& s) {
  REDCO_CHECK(height > 0 && width > 0, "render_line: image size [{}, {}] must be positive", height,
              width);
  REDCO_CHECK(s.noise >= 0.f && std::isfinite(s.noise),
              "render_line: noise {} must be a finite standard deviation >= 0", s.noise);
  Font::Impl& f = font.impl();
  f.set_size(s.size);
  std::fill(out, out + height * width, 0.f);
  // The baseline sits one ascender below the line's top.
  const int64_t baseline = std::lround(s.y) + (f.face->size->metrics.ascender + 63) / 64;
  FT_Pos pen = FT_Pos(std::lround(s.x)) * 64;  // 26.6
  FT_UInt prev = 0;
  for (size_t i = 0; i < text.size();) {
    const FT_UInt g = f.glyph(next_code_point(text, i));
    pen += f.kerning(prev, g);
    if (FT_Load_Glyph(f.face, g, FT_LOAD_RENDER) != 0)
      fail("font {}: cannot render glyph {}", f.file.string(), g);
    const FT_GlyphSlot slot = f.face->glyph;
    blend(out, height, width, slot->bitmap, baseline - slot->bitmap_top,
          (pen >> 6) + slot->bitmap_left);
    pen += slot->advance.x;
    prev = g;
    if ((pen >> 6) > width) break;  // the rest is clipped
  }
  if (s.noise > 0.f) {
    thread_local std::vector<float> noise;  // reused: batches render many lines
    noise.resize(size_t(height * width));
    philox_normal(noise.data(), height * width, s.seed, stream_of("render_line"), 0, 0.f, s.noise);
    for (int64_t k = 0; k < height * width; ++k) out[k] += noise[size_t(k)];
  }
}

#else

bool have_freetype() { return false; }

struct Font::Impl {
  std::filesystem::path file;
};

Font::Font(const std::filesystem::path& file) : impl_(std::make_unique<Impl>()) {
  impl_->file = file;
  fail(
      "font {}: this build of redco has no FreeType (install Debian's libfreetype-dev, then "
      "run `meson setup --reconfigure build`)",
      file.string());
}

float line_advance(const Font&, std::string_view, float) {
  fail("line_advance: this build of redco has no FreeType (install libfreetype-dev)");
}

void render_line_into(float*, int64_t, int64_t, const Font&, std::string_view, const LineStyle&) {
  fail("render_line: this build of redco has no FreeType (install libfreetype-dev)");
}

#endif

Font::~Font() = default;
Font::Font(Font&&) noexcept = default;
Font& Font::operator=(Font&&) noexcept = default;
const std::filesystem::path& Font::file() const { return impl_->file; }

DrawnStyle draw_style(const StyleRange& r, size_t fonts, uint64_t seed, uint64_t key) {
  REDCO_CHECK(fonts > 0, "draw_style: no fonts to choose from");
  REDCO_CHECK(r.min_size > 0.f && r.min_size <= r.max_size && r.max_x >= 0.f && r.max_y >= 0.f &&
                  r.max_noise >= 0.f,
              "draw_style: ranges must be non-negative with 0 < min_size <= max_size");
  float u[5];  // uniform [0, 1): size, x, y, noise, font
  philox_uniform(u, 5, seed, stream_of("draw_style"), int64_t(key) * 5, 0.f, 1.f);
  DrawnStyle d;
  d.style = {.size = r.min_size + (r.max_size - r.min_size) * u[0],
             .x = r.max_x * u[1],
             .y = r.max_y * u[2],
             .noise = r.max_noise * u[3],
             .seed = seed ^ (key * 0x9e3779b97f4a7c15ull)};
  d.font = std::min(fonts - 1, size_t(u[4] * float(fonts)));
  return d;
}

std::vector<std::string> wrap_words(std::string_view text, size_t max_chars) {
  REDCO_CHECK(max_chars > 0, "wrap_words: max_chars must be positive");
  std::vector<std::string> lines;
  std::string cur;
  for (size_t a = 0; a < text.size();) {
    const size_t b = std::min(text.find(' ', a), text.size());
    const std::string_view word = text.substr(a, std::min(b - a, max_chars));
    if (!word.empty()) {
      if (!cur.empty() && cur.size() + 1 + word.size() > max_chars)
        lines.push_back(std::move(cur)), cur.clear();
      if (!cur.empty()) cur += ' ';
      cur += word;
    }
    a = b + 1;
  }
  if (!cur.empty()) lines.push_back(std::move(cur));
  return lines;
}

Tensor render_line(const Font& font, std::string_view text, const LineStyle& style, int64_t height,
                   int64_t width) {
  if (width == 0) width = int64_t(std::ceil(style.x + line_advance(font, text, style.size))) + 1;
  Tensor img = Tensor::empty(Shape{height, width});
  render_line_into(img.data<float>(), height, width, font, text, style);
  return img;
}

}  // namespace redco::data
