// PNG: the 8-byte signature, then chunks (length, type, data, CRC-32 of type
// and data): IHDR (size, 8-bit depth, colour type 0 gray / 2 RGB), one IDAT
// holding the zlib stream of the rows (each led by filter byte 0: none), IEND.
#include "redco/io/png.hpp"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "redco/core/error.hpp"

namespace redco::io {
namespace {

void put_u32(std::vector<uint8_t>& out, uint32_t v) {  // big-endian, as PNG stores integers
  for (int s = 24; s >= 0; s -= 8) out.push_back(uint8_t(v >> s));
}

void put_chunk(std::vector<uint8_t>& out, const char (&type)[5], const std::vector<uint8_t>& data) {
  put_u32(out, uint32_t(data.size()));
  const size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  const uLong crc = crc32(0L, out.data() + start, uInt(out.size() - start));
  put_u32(out, uint32_t(crc));
}

}  // namespace

void write_png(const std::filesystem::path& file, std::span<const uint8_t> pixels, int64_t width,
               int64_t height, int channels) {
  REDCO_CHECK(width > 0 && height > 0 && width < (1 << 24) && height < (1 << 24) &&
                  (channels == 1 || channels == 3),
              "write_png {}: need a positive size and 1 (gray) or 3 (RGB) channels, got {}x{}x{}",
              file.string(), width, height, channels);
  const auto row = size_t(width * channels);
  REDCO_CHECK(pixels.size() == row * size_t(height),
              "write_png {}: {} bytes given for {}x{} pixels of {} channels", file.string(),
              pixels.size(), width, height, channels);
  std::vector<uint8_t> raw;  // each row led by its filter type, 0 (none)
  raw.reserve((row + 1) * size_t(height));
  for (int64_t y = 0; y < height; ++y) {
    raw.push_back(0);
    raw.insert(raw.end(), pixels.begin() + std::ptrdiff_t(size_t(y) * row),
               pixels.begin() + std::ptrdiff_t(size_t(y + 1) * row));
  }
  uLongf packed_size = compressBound(uLong(raw.size()));
  std::vector<uint8_t> packed(packed_size);
  REDCO_CHECK(compress2(packed.data(), &packed_size, raw.data(), uLong(raw.size()), 6) == Z_OK,
              "write_png {}: zlib failed to compress the image", file.string());
  packed.resize(packed_size);

  std::vector<uint8_t> out{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr;
  put_u32(ihdr, uint32_t(width));
  put_u32(ihdr, uint32_t(height));
  ihdr.insert(ihdr.end(), {8, uint8_t(channels == 1 ? 0 : 2), 0, 0, 0});
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", packed);
  put_chunk(out, "IEND", {});
  std::ofstream f(file, std::ios::binary);
  f.write(reinterpret_cast<const char*>(out.data()), std::streamsize(out.size()));
  f.close();
  REDCO_CHECK(f.good(), "write_png: cannot write {} (does its folder exist and is it writable?)",
              file.string());
}

void write_image_grid(const std::filesystem::path& file, const Tensor& images_in, int64_t columns,
                      float lo, float hi, int64_t gap) {
  const Tensor images = images_in.to(Device::cpu()).to(DType::f32);
  REDCO_CHECK(images.rank() == 4 && (images.dim(1) == 1 || images.dim(1) == 3) &&
                  images.dim(0) > 0 && columns > 0 && gap >= 0 && hi > lo,
              "write_image_grid {}: expected images [N, 1 or 3, H, W], columns > 0 and lo < hi; "
              "got {}, {} columns, [{}, {}]",
              file.string(), images.shape(), columns, lo, hi);
  const int64_t N = images.dim(0), C = images.dim(1), H = images.dim(2), W = images.dim(3);
  const int64_t cols = std::min(columns, N), rows = (N + cols - 1) / cols;
  const int64_t width = cols * W + (cols - 1) * gap, height = rows * H + (rows - 1) * gap;
  std::vector<uint8_t> px(size_t(width * height * C), 0);
  const std::vector<float> v = images.to_vector();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t x0 = (n % cols) * (W + gap), y0 = (n / cols) * (H + gap);
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x) {
          const float u = (v[size_t(((n * C + c) * H + y) * W + x)] - lo) / (hi - lo);
          px[size_t(((y0 + y) * width + x0 + x) * C + c)] =
              uint8_t(std::lround(std::clamp(u, 0.f, 1.f) * 255.f));
        }
  }
  write_png(file, px, width, height, int(C));
}

}  // namespace redco::io
