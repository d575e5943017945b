#pragma once
// A minimal PNG writer (8-bit grayscale or RGB, zlib-compressed, no filters)
// for sample images: a diffusion model's generations, a grid of inputs.
#include <cstdint>
#include <filesystem>
#include <span>

#include "redco/core/tensor.hpp"

namespace redco::io {

// pixels: height rows of width * channels bytes (channels 1: gray, 3: RGB).
void write_png(const std::filesystem::path& file, std::span<const uint8_t> pixels, int64_t width,
               int64_t height, int channels);

// Images f32 [N, C, H, W] (C 1 or 3) with values in [lo, hi] (clamped),
// tiled row-major into a grid of `columns` columns with a `gap`-pixel black
// border between them, written as one PNG.
void write_image_grid(const std::filesystem::path& file, const Tensor& images, int64_t columns,
                      float lo = -1.f, float hi = 1.f, int64_t gap = 2);

}  // namespace redco::io
