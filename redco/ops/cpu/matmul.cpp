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
#include <array>
#include <cstring>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/gemm.hpp"
#include "redco/ops/cpu/tensor_ops.hpp"
#include "redco/ops/matmul_batch.hpp"

namespace redco::cpu {
namespace {

using namespace matmul_detail;

Tensor as_f32(const Tensor& x) { return x.dtype() == DType::f32 ? x : x.to(DType::f32); }

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

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b) {
  const Shape& as = a_in.shape();
  const Shape& bs = b_in.shape();
  REDCO_CHECK(as.rank() >= 2 && bs.rank() >= 2,
              "matmul: both operands need at least 2 dims, got shapes {} and {}", as, bs);
  REDCO_CHECK(is_floating(a_in.dtype()) && is_floating(b_in.dtype()),
              "matmul: needs floating-point operands, got {} {} and {} {}",
              dtype_name(a_in.dtype()), as, dtype_name(b_in.dtype()), bs);
  const int64_t ar = as[-2], ac = as[-1], br = bs[-2], bc = bs[-1];
  const Gemm g{trans_a, trans_b, trans_a ? ac : ar, trans_b ? br : bc, trans_a ? ar : ac, ac, bc};
  const int64_t kb = trans_b ? bc : br;
  REDCO_CHECK(g.K == kb,
              "matmul: shapes {} and {} do not match: op(a) has K = {} but op(b) has K = {} "
              "(trans_a={}, trans_b={})",
              as, bs, g.K, kb, trans_a, trans_b);
  const Batch bt = broadcast_batch(as, bs, ar * ac, br * bc);
  Shape out_shape;
  {
    Dims dims{};
    const int r = std::max(as.rank(), bs.rank()) - 2;
    for (int i = 0; i < r; ++i) {
      const int ia = as.rank() - 2 - r + i, ib = bs.rank() - 2 - r + i;
      dims[size_t(i)] = std::max(ia >= 0 ? as[ia] : 1, ib >= 0 ? bs[ib] : 1);
    }
    dims[size_t(r)] = g.M;
    dims[size_t(r + 1)] = g.N;
    out_shape = Shape(std::span<const int64_t>(dims.data(), size_t(r + 2)));
  }
  Tensor c = Tensor::empty(out_shape, DType::f32, a_in.device());
  if (c.numel() == 0) return c;
  if (g.K == 0) {  // an empty sum: zeros, without asking the GEMM about K = 0
    std::memset(c.raw(), 0, c.nbytes());
    return c;
  }
  const Tensor a = as_f32(a_in), b = as_f32(b_in);
  if (bs.rank() == 2 && !trans_a) {
    // Linear-layer fast path: a's rows are contiguous across its batch dims.
    sgemm(false, trans_b, a.numel() / g.K, g.N, g.K, 1.f, a.data<float>(), g.lda, b.data<float>(),
          g.ldb, 0.f, c.data<float>(), g.N);
    return c;
  }
  run_batched(g, bt, a.data<float>(), b.data<float>(), c.data<float>());
  return c;
}

}  // namespace redco::cpu
