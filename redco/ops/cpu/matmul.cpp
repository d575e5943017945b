// Batched matrix product op(a)[..., M, K] x op(b)[..., K, N] with numpy
// broadcasting of the batch dims, on top of sgemm / sgemm_batched.
//
// The transposes are never materialised: they are GEMM flags. The common
// shapes each become one GEMM call:
//   - b is a plain matrix and a is not transposed (every linear layer):
//     a's leading dims fold into M, one [B*M, K] x [K, N] GEMM, which a GEMM
//     library runs much faster than B small ones;
//   - equal batch dims, or one side without batch dims (a weight shared by
//     every head): one sgemm_batched, the shared side with stride 0.
// Any other broadcast (e.g. [2, 1] against [1, 3] batches) loops over the
// outer batch indices with one sgemm_batched per innermost batch axis.
// Inputs of other floating dtypes are converted to f32; the result is f32.
//
// Mixed precision (Precision::bf16, redco/core/dtype.hpp): both operands are
// rounded to bf16 (nearest, ties to even) and the products accumulate in f32.
// A product of two bf16 values is exact in f32, so running the f32 GEMM on
// the rounded operands gives the numerics of a bf16 GEMM with f32
// accumulation, which is what this CPU path does: on CPUs without bf16 dot
// products (AVX2, AVX-512 without BF16) it is also the fastest way, since
// oneDNN has no fast bf16 GEMM there. The rounding is one streaming pass over
// each operand, done where it is needed (a bf16-stored operand is already
// exact and is only widened). Where the CPU has bf16 dot products that beat
// its f32 FMAs (AMX; AVX512_BF16 at full rate: bf16_gemm_pays), unbroadcast
// products run as oneDNN bf16 GEMMs instead (gemm_bf16), at up to twice the
// f32 rate.
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cstring>
#include <string>

#include "redco/core/error.hpp"
#include "redco/core/profile.hpp"
#include "redco/ops/cpu/decode_panels.hpp"
#include "redco/ops/cpu/gemm.hpp"
#include "redco/ops/cpu/parallel.hpp"
#include "redco/ops/cpu/prefill_i8.hpp"
#include "redco/ops/cpu/prefill_panels.hpp"
#include "redco/ops/cpu/quantized_rows.hpp"
#include "redco/ops/cpu/skinny_bf16.hpp"
#include "redco/ops/cpu/skinny_f32.hpp"
#include "redco/ops/cpu/skinny_i8.hpp"
#include "redco/ops/cpu/skinny_i8_panels.hpp"
#include "redco/ops/cpu/skinny_panels.hpp"
#include "redco/ops/cpu/tensor_ops.hpp"
#include "redco/ops/matmul_batch.hpp"
#include "redco/ops/meta.hpp"

namespace redco::cpu {
namespace {

using namespace matmul_detail;

Tensor as_f32(const Tensor& x) { return x.dtype() == DType::f32 ? x : x.to(DType::f32); }

// x (f32) with every element rounded to the nearest bf16, still stored as f32.
// Branch-free so it vectorises; NaN and infinity pass through unchanged.
Tensor round_to_bf16(const Tensor& x) {
  Tensor out = Tensor::empty(x.shape(), DType::f32, x.device());
  const auto* src = static_cast<const uint32_t*>(x.raw());  // [numel] f32 bits
  auto* dst = static_cast<uint32_t*>(out.raw());            // [numel] f32 bits
  parallel_chunks(x.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint32_t u = src[i];
      const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
      dst[i] = (u & 0x7f800000u) == 0x7f800000u ? u : rounded;  // inf / NaN: unchanged
    }
  });
  return out;
}

// The f32 operand a GEMM reads under the current precision.
Tensor gemm_operand(const Tensor& x) {
  if (matmul_precision() == Precision::bf16 && x.dtype() == DType::f32) return round_to_bf16(x);
  return as_f32(x);
}

struct Gemm {
  bool ta, tb;
  int64_t M, N, K, lda, ldb;
};

// Runs every matrix of the (simplified) batch: the innermost batch axis in one
// sgemm_batched, the others in a loop.
void run_batched(const Gemm& g, const Batch& bt, const float* A, const float* B, float* C) {
  const int64_t mat_c = g.M * g.N;
  if (bt.rank == 0) {
    sgemm(g.ta, g.tb, g.M, g.N, g.K, 1.f, A, g.lda, B, g.ldb, 0.f, C, g.N);
    return;
  }
  const size_t in = size_t(bt.rank - 1);
  int64_t outer = 1;
  for (size_t d = 0; d < in; ++d) outer *= bt.dims[d];
  for (int64_t o = 0; o < outer; ++o) {
    int64_t off_a = 0, off_b = 0, rest = o;
    for (size_t d = in; d-- > 0;) {
      const int64_t idx = rest % bt.dims[d];
      rest /= bt.dims[d];
      off_a += idx * bt.sa[d];
      off_b += idx * bt.sb[d];
    }
    sgemm_batched(bt.dims[in], g.ta, g.tb, g.M, g.N, g.K, 1.f, A + off_a, g.lda, bt.sa[in],
                  B + off_b, g.ldb, bt.sb[in], 0.f, C + o * bt.dims[in] * mat_c, g.N, mat_c);
  }
}

// True for a transposed A (stored [K, M]) whose rows are a multiple of 256
// floats (1 KiB) apart, over a long K: oneDNN's packing of such an A walks
// addresses that map to the same few cache sets, and runs at half speed or
// less (S-sized weight gradients, M = 1024 or 8192, K = 2048: 2.2x slower
// than the same product on A^T copied to [M, K], measured per CPU-second).
bool aliasing_stride(const Gemm& g) {
  return g.ta && g.lda % 256 == 0 && g.K >= 512 && g.M * g.N * g.K >= (int64_t{1} << 24);
}

// Under --profile, GEMM time is keyed by the product's shape as well
// (empty when not profiling: no formatting in a timed step).
std::string gemm_key(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const char* suffix) {
  if (!profile::enabled()) return {};
  return fmt::format(" {}{} {}x{}x{}{}", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, suffix);
}

// Without AMX, from this many rows an int8 weight is widened to f32 for
// sgemm rather than run through the decode kernel in blocks: LLaMA 1.1B
// prefill, 2 threads, tokens/s decode kernel against sgemm: 32 rows 69.7 /
// 51.7, 64 rows 65.7 / 69.2, 96 rows 65.5 / 76.9, 128 rows 68.2 / 91.
constexpr int64_t kWidenI8Rows = 64;

std::atomic<Bf16GemmPath> g_bf16_path{Bf16GemmPath::automatic};

// Under Precision::bf16, whether GEMMs run as oneDNN bf16 GEMMs (the CPU has
// bf16 dot products, or a test forces it) rather than sgemm on rounded operands.
bool use_native_bf16() {
  if (matmul_precision() != Precision::bf16) return false;
  const Bf16GemmPath path = g_bf16_path.load(std::memory_order_relaxed);
  return path == Bf16GemmPath::onednn || (path == Bf16GemmPath::automatic && bf16_gemm_pays());
}

// C (f32, rows of g.N floats) = or += op(a) op(b) as one oneDNN bf16 GEMM on
// bf16 copies of the operands (no copy for an operand stored as bf16).
void run_bf16(const Gemm& g, const Tensor& a_in, const Tensor& b_in, Tensor& c, bool accumulate) {
  const Tensor a = a_in.to(DType::bf16), b = b_in.to(DType::bf16);
  gemm_bf16(g.ta, g.tb, g.M, g.N, g.K, static_cast<const uint16_t*>(a.raw()), g.lda,
            static_cast<const uint16_t*>(b.raw()), g.ldb, c.data<float>(), g.N, accumulate);
}

// Under Precision::bf16 on a CPU with bf16 dot products, a product with no
// batch broadcasting (a linear layer, a weight gradient) runs as one oneDNN
// bf16 GEMM on bf16 copies of the operands. Returns false (nothing done) when
// that path does not apply; the caller then rounds and runs sgemm.
bool native_bf16(const Tensor& a_in, const Tensor& b_in, const Gemm& g, const Batch& bt,
                 Tensor& c) {
  if (!use_native_bf16()) return false;
  const bool fold = b_in.rank() == 2 && !g.ta;  // a's batch dims fold into M
  if (!fold && bt.rank != 0) return false;
  const int64_t M = fold ? a_in.numel() / g.K : g.M;
  run_bf16({g.ta, g.tb, M, g.N, g.K, g.lda, g.ldb}, a_in, b_in, c, false);
  return true;
}

}  // namespace

void set_bf16_gemm_path(Bf16GemmPath path) { g_bf16_path.store(path); }

Tensor matmul(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b) {
  const Shape& as = a_in.shape();
  const Shape& bs = b_in.shape();
  const int64_t ar = as[-2], ac = as[-1], br = bs[-2], bc = bs[-1];
  const Gemm g{trans_a, trans_b, trans_a ? ac : ar, trans_b ? br : bc, trans_a ? ar : ac, ac, bc};
  const Batch bt = broadcast_batch(as, bs, ar * ac, br * bc);
  const Shape out_shape = meta::matmul_shape(as, bs, trans_a, trans_b);
  Tensor c = Tensor::empty(out_shape, DType::f32, a_in.device());
  if (c.numel() == 0) return c;
  if (g.K == 0) {  // an empty sum: zeros, without asking the GEMM about K = 0
    std::memset(c.raw(), 0, c.nbytes());
    return c;
  }
  // A linear layer's leading dims fold into M (the fast path below), so its
  // profile key shows the one GEMM that runs.
  const bool folds = bs.rank() == 2 && !trans_a;
  const std::string shape_key = gemm_key(trans_a, trans_b, folds ? a_in.numel() / g.K : g.M, g.N,
                                         g.K, folds || bt.rank == 0 ? "" : " batched");
  profile::Scope scope("gemm", shape_key.empty() ? nullptr : shape_key.c_str());
  if (folds && trans_b && in_i8_panels(b_in) && !a_in.requires_grad()) {
    // Against int8 weights packed in panels: a prefill on the CPU's bf16 units
    // where it has them (prefill_panels.hpp: activations rounded to bf16);
    // else the f32 chain kernel (skinny_i8_panels.hpp: exact activations, a
    // row's bits whatever the batch) up to kWidenI8Rows rows, past which the
    // general path below widens the weight for sgemm.
    const Tensor a = gemm_operand(a_in);
    const int64_t rows = a.numel() / g.K;
    if (rows >= kPrefillRows && prefill_unit() != PrefillUnit::none) {
      prefill_matmul_i8_panels(a.data<float>(), g.K, i8_panel_data(b_in), i8_panel_scales(b_in),
                               c.data<float>(), g.N, rows, g.N, g.K, prefill_unit());
      return c;
    }
    if (rows < kWidenI8Rows) {
      skinny_matmul_i8_panels(a.data<float>(), g.K, i8_panel_data(b_in), i8_panel_scales(b_in),
                              c.data<float>(), g.N, rows, g.N, g.K);
      return c;
    }
  }
  if (folds && trans_b && row_scales(b_in) && a_in.numel() / g.K <= kSkinnyRows) {
    // Decoding against int8 weights: a byte a weight, scaled per row (skinny_i8.hpp).
    const Tensor a = gemm_operand(a_in);
    skinny_matmul_i8(a.data<float>(), g.K, static_cast<const int8_t*>(b_in.raw()), g.ldb,
                     row_scales(b_in)->data<float>(), c.data<float>(), g.N, a.numel() / g.K, g.N,
                     g.K);
    return c;
  }
  const int64_t a_rows = a_in.numel() / g.K;
  if (folds && trans_b && row_scales(b_in) && !a_in.requires_grad() &&
      (a_rows < kWidenI8Rows || prefill_unit() == PrefillUnit::amx)) {
    // Prefilling against int8 weights without widening them in memory
    // (prefill_i8.hpp): AMX from a block of rows where the CPU has it, the
    // decode kernel over L2-sized blocks for short prompts. Without AMX, long
    // prompts widen the weight and run sgemm (kWidenI8Rows).
    const Tensor a = gemm_operand(a_in);
    const int64_t rows = a_rows;
    const bool amx = rows >= kPrefillRows && prefill_unit() == PrefillUnit::amx;
    prefill_matmul_i8(a.data<float>(), g.K, static_cast<const int8_t*>(b_in.raw()), g.ldb,
                      row_scales(b_in)->data<float>(), c.data<float>(), g.N, rows, g.N, g.K,
                      amx ? PrefillUnit::amx : PrefillUnit::none);
    return c;
  }
  if (folds && trans_b && in_panels(b_in)) {
    // Against bf16 weights packed in panels. Many rows (a prefill) on the
    // CPU's bf16 dot-product units where it has them (prefill_panels.hpp:
    // activations rounded to bf16); else, and for decode steps and short
    // prompts, the f32 chain kernel (skinny_panels.hpp), which also keeps pace
    // with widening the weights for sgemm (LLaMA 1.1B, 512 and 4096 rows: 118
    // and 131 tokens/s against 87 and 129) with every output one chain over k.
    const Tensor a = gemm_operand(a_in);
    const int64_t rows = a.numel() / g.K;
    if (rows >= kPrefillRows && prefill_unit() != PrefillUnit::none && !a_in.requires_grad()) {
      prefill_matmul_panels(a.data<float>(), g.K, panel_data(b_in), c.data<float>(), g.N, rows, g.N,
                            g.K, prefill_unit());
      return c;
    }
    skinny_matmul_panels(a.data<float>(), g.K, panel_data(b_in), c.data<float>(), g.N,
                         a.numel() / g.K, g.N, g.K);
    return c;
  }
  if (folds && trans_b && b_in.dtype() == DType::bf16 && a_in.numel() / g.K <= kSkinnyRows) {
    // Decoding against bf16 weights: read them once as stored (skinny_bf16.hpp).
    const Tensor a = gemm_operand(a_in);
    skinny_matmul_bf16(a.data<float>(), g.K, static_cast<const uint16_t*>(b_in.raw()), g.ldb,
                       c.data<float>(), g.N, a.numel() / g.K, g.N, g.K);
    return c;
  }
  if (folds && trans_b && b_in.dtype() == DType::f32 && a_in.numel() / g.K <= kSkinnyRows &&
      !a_in.requires_grad()) {
    // Decoding against f32 weights: one streaming pass over them (skinny_f32.hpp).
    // Only where no gradient flows through a (inference): training keeps one
    // GEMM for every row count, so a step's rounding does not depend on how
    // few rows it has, and sharded runs keep matching the 1-device run.
    const Tensor a = gemm_operand(a_in);
    skinny_matmul_f32(a.data<float>(), g.K, b_in.data<float>(), g.ldb, c.data<float>(), g.N,
                      a.numel() / g.K, g.N, g.K);
    return c;
  }
  if (native_bf16(a_in, b_in, g, bt, c)) return c;
  const Tensor a = gemm_operand(a_in), b = gemm_operand(b_in);
  if (folds) {
    // Linear-layer fast path: a's rows are contiguous across its batch dims.
    sgemm(false, trans_b, a.numel() / g.K, g.N, g.K, 1.f, a.data<float>(), g.lda, b.data<float>(),
          g.ldb, 0.f, c.data<float>(), g.N);
    return c;
  }
  if (trans_a && bt.rank == 0 && aliasing_stride(g)) {
    // A weight gradient dW = dY^T X whose dY rows are a power-of-two number of
    // floats apart: an explicit transpose (one streaming copy) and a plain GEMM.
    const Tensor at = permute(a, std::array<int, 2>{1, 0});  // [M, K]
    run_batched({false, trans_b, g.M, g.N, g.K, g.K, g.ldb}, bt, at.data<float>(), b.data<float>(),
                c.data<float>());
    return c;
  }
  run_batched(g, bt, a.data<float>(), b.data<float>(), c.data<float>());
  return c;
}

void matmul_into(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b, Tensor& c,
                 bool accumulate) {
  const auto [M, N, K] = into_dims(a_in, b_in, trans_a, trans_b, c);
  if (M * N == 0) return;
  if (K == 0) {  // an empty sum adds nothing
    if (!accumulate) std::memset(c.raw(), 0, c.nbytes());
    return;
  }
  const std::string shape_key = gemm_key(trans_a, trans_b, M, N, K, accumulate ? " +=" : "");
  profile::Scope scope("gemm", shape_key.empty() ? nullptr : shape_key.c_str());
  if (use_native_bf16())
    return run_bf16({trans_a, trans_b, M, N, K, a_in.dim(1), b_in.dim(1)}, a_in, b_in, c,
                    accumulate);
  const Tensor a = gemm_operand(a_in), b = gemm_operand(b_in);
  sgemm(trans_a, trans_b, M, N, K, 1.f, a.data<float>(), a.dim(1), b.data<float>(), b.dim(1),
        accumulate ? 1.f : 0.f, c.data<float>(), N);
}

}  // namespace redco::cpu
