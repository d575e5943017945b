#pragma once
// Single-precision GEMM on the CPU, row-major, BLAS semantics.
// The one place redco calls into a GEMM library; every matmul, linear layer and
// convolution ends up here.
#include <cstdint>

namespace redco::cpu {

// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C[M,N]   (all row-major)
// op(A) = A stored [M,K] with row stride lda, or A^T when trans_a (A stored [K,M]).
// op(B) = B stored [K,N] with row stride ldb, or B^T when trans_b (B stored [N,K]).
// beta == 0 means C is write-only (its old contents may be NaN).
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// `batch` independent GEMMs; matrix i uses A + i*stride_a etc. A stride of 0
// broadcasts one matrix across the batch (e.g. a weight shared by every head).
void sgemm_batched(int64_t batch, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   float alpha, const float* A, int64_t lda, int64_t stride_a, const float* B,
                   int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
                   int64_t stride_c);

// C[M,N] = op(A)[M,K] * op(B)[K,N] (or C += that, with `accumulate`) with A
// and B in bf16 (raw bits) and C in f32; products accumulate in f32. Runs oneDNN's matmul
// primitive, tiled over TBB like sgemm. Fast only where the CPU has bf16 dot
// products (see has_native_bf16); elsewhere oneDNN falls back to a slow
// reference kernel, so callers round to bf16 and use sgemm instead.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc,
               bool accumulate = false);

// True when the CPU has bf16 dot-product instructions (AVX512_BF16 or AMX).
bool has_native_bf16();

// Whether gemm_bf16 is the faster way to a bf16 product here than sgemm on
// operands rounded to bf16. Having the instructions is not enough: a CPU may
// run vdpbf16ps at half its f32 FMA rate (a Sapphire Rapids VM without AMX:
// 155 against 335 GFLOP/s), where oneDNN's bf16 GEMM trains GPT-2 at 0.65x
// f32. Decided once per process: with AMX yes; else by timing both on one
// product, and gemm_bf16 must be 1.25x faster (a margin, so that a machine
// near parity decides the same way every run). REDCO_BF16_GEMM=onednn|sgemm
// decides instead.
bool bf16_gemm_pays();

}  // namespace redco::cpu
