#pragma once
// Internals shared by the CUDA backend's host code and its kernels (.cu):
// error checking, the stream every kernel runs on, and the raw-pointer
// launchers the backend calls. Nothing here touches Tensor, so the .cu files
// compile without fmt/Eigen in the way of nvcc.
//
// Streams: redco runs all device work of a device on ONE stream, created
// (non-blocking) on first use. Kernels, cuBLAS and copies are therefore
// ordered, which is what lets the caching allocator hand a freed block to the
// next request at once: the block's next use is enqueued after its last one.
// A device-to-host copy synchronises that stream before it returns.
#include <cuda_runtime.h>

#include <cstdint>

#include "redco/core/dtype.hpp"

namespace redco::cuda {

// Throws redco::Error naming `what` and the CUDA error string.
void check(cudaError_t e, const char* what);
#define REDCO_CUDA(call) ::redco::cuda::check((call), #call)
// Checks the last kernel launch.
void check_launch(const char* kernel);

cudaStream_t stream();  // the stream of the current device
int current_device();
void set_device(int device);

constexpr int kMaxRank = 8;
// Element strides of each operand for a contiguous output of shape dims.
struct Strided {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t a[kMaxRank] = {};  // strides of the first operand (0: broadcast)
  int64_t b[kMaxRank] = {};  // strides of the second operand
};

namespace k {
// elementwise.cu (op codes are the values of UnaryOp / BinaryOp)
void unary(int op, const float* x, float* y, int64_t n);
// s.rank == 0: a and b have n elements each (no broadcasting).
void binary(int op, const float* a, const float* b, float* y, int64_t n, const Strided& s);
void binary_scalar(int op, const float* a, float s, float* y, int64_t n);
void add_inplace(float* a, const float* b, int64_t n);
void fill(void* p, DType dt, int64_t n, float v);
void convert(void* dst, DType dd, const void* src, DType sd, int64_t n);
void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool tanh_approx);
void silu_forward(const float* x, float* y, int64_t n);
void silu_backward(const float* x, const float* dy, float* dx, int64_t n);
void dropout_mask(float* m, int64_t n, float p, uint64_t seed, uint64_t stream);

// reduce.cu: [O, R, I] -> [O, I]
void reduce_pass(bool is_max, const float* x, float* y, int64_t O, int64_t R, int64_t I);
void argmax(const float* x, int64_t* y, int64_t O, int64_t R, int64_t I);
// out[i] = in[offset of i under s.a] for a contiguous out of shape s.dims.
void gather(const void* in, void* out, int elem_size, const Strided& s, int64_t n);

// softmax.cu (rows of [N, D])
void softmax_forward(const float* x, float* y, int64_t N, int64_t D, bool log);
void softmax_backward(const float* y, const float* dy, float* dx, int64_t N, int64_t D, bool log);
void cross_entropy_forward(const float* logits, const int64_t* labels, float* losses, float* lse,
                           int64_t N, int64_t V, int64_t ignore_index);
void cross_entropy_backward(const float* logits, const int64_t* labels, const float* lse,
                            const float* dloss, float* dlogits, int64_t N, int64_t V,
                            int64_t ignore_index);
// norm.cu. beta/dbeta may be null; mean null selects RMS norm.
void norm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                  float* rstd, int64_t N, int64_t D, float eps);
// dx, and per-chunk partials [chunks, 2, D] of dgamma/dbeta to be summed over chunks.
void norm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                   const float* rstd, float* dx, float* partials, int64_t chunks, int64_t N,
                   int64_t D);
int64_t norm_chunks(int64_t N);
// group_norm.cu: x [N, C, S], G groups; saves mean/rstd [N*G]. The backward
// writes dx and partials [2, N, C] (sums over S of dy*xhat, then of dy), which
// the caller sums over N for dgamma and dbeta.
void group_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, int64_t N, int64_t C, int64_t S, int64_t G,
                        float eps);
void group_norm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                         const float* rstd, float* dx, float* partials, int64_t N, int64_t C,
                         int64_t S, int64_t G);
// x [P, H, W] -> y [P, H*f, W*f] and its adjoint (block sums).
void upsample_nearest2d_forward(const float* x, float* y, int64_t P, int64_t H, int64_t W,
                                int64_t f);
void upsample_nearest2d_backward(const float* dy, float* dx, int64_t P, int64_t H, int64_t W,
                                 int64_t f);
// embedding.cu
void embedding_forward(const float* table, const int64_t* ids, float* out, int64_t n, int64_t D);
size_t embedding_backward_scratch(int64_t n);  // bytes of scratch the backward needs
void embedding_backward(const float* dout, const int64_t* ids, float* dtable, int64_t n, int64_t V,
                        int64_t D, void* scratch, size_t scratch_bytes);
// First index i with ids[i] outside [0, V) and != skip, or -1 (one small D2H read).
int64_t first_bad_id(const int64_t* ids, int64_t n, int64_t V, int64_t skip);
void rotary(const float* x, float* y, float* table, int64_t rows, int64_t T, int64_t D,
            int64_t pos_offset, float base, bool inverse);
}  // namespace k
}  // namespace redco::cuda
