// Interim correct GEMM on Eigen; replaced by the measured oneDNN path.
#include "redco/ops/cpu/gemm.hpp"

#include <Eigen/Core>

namespace redco::cpu {
namespace {
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using CMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;
using Map = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;
}  // namespace

void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  CMap a(A, ta ? K : M, ta ? M : K, Eigen::OuterStride<>(lda));
  CMap b(B, tb ? N : K, tb ? K : N, Eigen::OuterStride<>(ldb));
  Map c(C, M, N, Eigen::OuterStride<>(ldc));
  if (beta == 0.f)
    c.setZero();
  else if (beta != 1.f)
    c *= beta;
  if (!ta && !tb)
    c.noalias() += alpha * a * b;
  else if (ta && !tb)
    c.noalias() += alpha * a.transpose() * b;
  else if (!ta && tb)
    c.noalias() += alpha * a * b.transpose();
  else
    c.noalias() += alpha * a.transpose() * b.transpose();
}

void sgemm_batched(int64_t batch, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                   const float* A, int64_t lda, int64_t sa, const float* B, int64_t ldb, int64_t sb,
                   float beta, float* C, int64_t ldc, int64_t sc) {
  for (int64_t i = 0; i < batch; ++i)
    sgemm(ta, tb, M, N, K, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc, ldc);
}

}  // namespace redco::cpu
