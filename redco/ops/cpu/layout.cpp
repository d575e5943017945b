// Layout kernels: broadcast_to, permute, slice, slice_assign. They move
// elements without looking at them, so they work for every dtype: the copy
// loops are instantiated per element size (1, 2, 4, 8 bytes).
//
// broadcast_to and permute are both "gather into a contiguous output with
// arbitrary source strides" and share one engine. It first simplifies the
// problem: size-1 output axes are dropped and adjacent axes that are also
// adjacent in the source are merged, so e.g. permute(x, {0, 2, 1, 3}) of
// [B, T, H, D] becomes a copy of D-element runs and a broadcast of a bias
// becomes memcpy/fill of whole rows. When the last two merged axes are
// swapped relative to the source (a batched matrix transpose, which includes
// every permute that swaps the last two axes), it copies 32x32 tiles so both
// the reads and the writes stay within a few cache lines.
#include <fmt/ranges.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/parallel.hpp"
#include "redco/ops/cpu/tensor_ops.hpp"

namespace redco::cpu {
namespace {

constexpr int64_t kGrainBytes = 128 * 1024;  // bytes copied per task; below this, serial
constexpr int64_t kTile = 32;

using Dims = std::array<int64_t, Shape::kMaxRank>;

int64_t grain_for(int64_t bytes_per_item) { return cpu::grain_for(kGrainBytes, bytes_per_item); }

// A contiguous output of shape dims[0, rank) read from a source with element
// strides src[0, rank).
struct Gather {
  int rank = 0;
  Dims dims{}, src{};

  // Source offset of the start of outer block `idx` over axes [0, n_outer).
  int64_t offset(int64_t idx, int n_outer) const {
    int64_t off = 0;
    for (int d = n_outer - 1; d >= 0; --d) {
      off += (idx % dims[size_t(d)]) * src[size_t(d)];
      idx /= dims[size_t(d)];
    }
    return off;
  }
};

Gather simplify(const Shape& out, const Dims& src) {
  Gather g;
  for (int i = 0; i < out.rank(); ++i) {
    if (out[i] == 1) continue;
    const int last = g.rank - 1;
    if (last >= 0 && g.src[size_t(last)] == src[size_t(i)] * out[i]) {
      g.dims[size_t(last)] *= out[i];
      g.src[size_t(last)] = src[size_t(i)];
    } else {
      g.dims[size_t(g.rank)] = out[i];
      g.src[size_t(g.rank)] = src[size_t(i)];
      ++g.rank;
    }
  }
  return g;
}

// Batched transpose: out[b][i][j] = in[b][j][i], in tiles.
template <typename T>
void transpose_copy(const T* in, T* out, const Gather& g) {
  const int r = g.rank;
  const int64_t n1 = g.dims[size_t(r - 2)], n2 = g.dims[size_t(r - 1)];
  int64_t outer = 1;
  for (int d = 0; d < r - 2; ++d) outer *= g.dims[size_t(d)];
  const int64_t row_tiles = (n1 + kTile - 1) / kTile;
  const int64_t tile_bytes = kTile * n2 * int64_t(sizeof(T));
  parallel_chunks(outer * row_tiles, grain_for(tile_bytes), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / row_tiles, i0 = (t % row_tiles) * kTile;
      const T* src = in + g.offset(b, r - 2);
      T* dst = out + b * n1 * n2;
      const int64_t ni = std::min(n1 - i0, kTile);
      // The tile goes through a local buffer so that both the source rows and
      // the destination rows are touched in full contiguous runs: with
      // power-of-two row strides, a direct strided walk keeps evicting its own
      // cache lines (they all map to the same few L1 sets).
      T buf[kTile][kTile];
      for (int64_t j0 = 0; j0 < n2; j0 += kTile) {
        const int64_t nj = std::min(n2 - j0, kTile);
        for (int64_t j = 0; j < nj; ++j)
          for (int64_t i = 0; i < ni; ++i) buf[i][j] = src[(j0 + j) * n1 + i0 + i];
        for (int64_t i = 0; i < ni; ++i) std::copy_n(buf[i], nj, dst + (i0 + i) * n2 + j0);
      }
    }
  });
}

template <typename T>
void gather_copy(const T* in, T* out, const Gather& g) {
  if (g.rank == 0) {
    out[0] = in[0];
    return;
  }
  const int r = g.rank;
  if (r >= 2 && g.src[size_t(r - 2)] == 1 && g.src[size_t(r - 1)] == g.dims[size_t(r - 2)]) {
    transpose_copy(in, out, g);
    return;
  }
  const int64_t n = g.dims[size_t(r - 1)], step = g.src[size_t(r - 1)];
  int64_t rows = 1;
  for (int d = 0; d < r - 1; ++d) rows *= g.dims[size_t(d)];
  parallel_chunks(rows, grain_for(n * int64_t(sizeof(T))), [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const T* s = in + g.offset(row, r - 1);
      T* d = out + row * n;
      if (step == 1) {
        std::memcpy(d, s, size_t(n) * sizeof(T));
      } else if (step == 0) {
        std::fill_n(d, n, s[0]);
      } else {
        for (int64_t j = 0; j < n; ++j) d[j] = s[j * step];
      }
    }
  });
}

// Copies with the element type chosen by size, so every dtype shares the code.
void gather(const Tensor& x, Tensor& out, const Dims& src_strides) {
  if (out.numel() == 0) return;
  const Gather g = simplify(out.shape(), src_strides);
  switch (dtype_size(x.dtype())) {
    case 1:
      return gather_copy(static_cast<const uint8_t*>(x.raw()), static_cast<uint8_t*>(out.raw()), g);
    case 2:
      return gather_copy(static_cast<const uint16_t*>(x.raw()), static_cast<uint16_t*>(out.raw()),
                         g);
    case 4:
      return gather_copy(static_cast<const uint32_t*>(x.raw()), static_cast<uint32_t*>(out.raw()),
                         g);
    case 8:
      return gather_copy(static_cast<const uint64_t*>(x.raw()), static_cast<uint64_t*>(out.raw()),
                         g);
  }
  fail("layout: unsupported element size {}", dtype_size(x.dtype()));
}

Dims contiguous_strides(const Shape& s) {
  Dims st{};
  int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    st[size_t(i)] = acc;
    acc *= s[i];
  }
  return st;
}

// Copies `count` blocks of `block` bytes from a stride of src_stride bytes to
// one of dst_stride bytes.
void copy_blocks(const char* src, int64_t src_stride, char* dst, int64_t dst_stride, int64_t count,
                 int64_t block) {
  if (block == 0) return;
  parallel_chunks(count, grain_for(block), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      std::memcpy(dst + b * dst_stride, src + b * src_stride, size_t(block));
  });
}

// Bytes per index of `axis` (the product of the later dims times the element
// size) and the number of outer blocks before it.
void split_at(const Shape& s, int axis, size_t elem, int64_t* outer, int64_t* inner_bytes) {
  *outer = 1;
  for (int d = 0; d < axis; ++d) *outer *= s[d];
  int64_t inner = int64_t(elem);
  for (int d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  *inner_bytes = inner;
}

}  // namespace

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  const Shape& xs = x.shape();
  Dims src{};
  const Dims xst = contiguous_strides(xs);
  for (int i = 0; i < xs.rank(); ++i) {
    const size_t o = size_t(shape.rank() - xs.rank() + i);
    src[o] = xs[i] == 1 ? 0 : xst[size_t(i)];
  }
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  gather(x, out, src);
  return out;
}

Tensor permute(const Tensor& x, std::span<const int> perm) {
  const Shape& xs = x.shape();
  const Dims xst = contiguous_strides(xs);
  Dims src{};
  Shape out_shape = xs;
  for (size_t i = 0; i < perm.size(); ++i) {
    out_shape[int(i)] = xs[perm[i]];
    src[i] = xst[size_t(perm[i])];
  }
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  gather(x, out, src);
  return out;
}

Tensor slice(const Tensor& x, int axis_in, int64_t start, int64_t len) {
  const int axis = x.shape().axis(axis_in);
  const int64_t n = x.dim(axis);
  Tensor out = Tensor::empty(x.shape().with(axis, len), x.dtype(), x.device());
  int64_t outer, inner;
  split_at(x.shape(), axis, dtype_size(x.dtype()), &outer, &inner);
  copy_blocks(static_cast<const char*>(x.raw()) + start * inner, n * inner,
              static_cast<char*>(out.raw()), len * inner, outer, len * inner);
  return out;
}

void slice_assign(Tensor& dst, const Tensor& src_in, int axis_in, int64_t start) {
  const int axis = dst.shape().axis(axis_in);
  const int64_t n = dst.dim(axis);
  const int64_t len = src_in.dim(axis);
  const Tensor src = src_in.dtype() == dst.dtype() ? src_in : src_in.to(dst.dtype());
  int64_t outer, inner;
  split_at(dst.shape(), axis, dtype_size(dst.dtype()), &outer, &inner);
  copy_blocks(static_cast<const char*>(src.raw()), len * inner,
              static_cast<char*>(dst.raw()) + start * inner, n * inner, outer, len * inner);
}

}  // namespace redco::cpu
