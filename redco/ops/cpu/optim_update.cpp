// The optimizers' element loops on the CPU (Backend::sgd_update, adam_update,
// sum_of_squares); the host-side arithmetic is in redco/optim/optimizer.cpp.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>

#include <Eigen/Core>
#include <algorithm>
#include <functional>

#include "redco/core/error.hpp"
#include "redco/ops/cpu/backend_cpu.hpp"
#include "redco/ops/cpu/parallel.hpp"

namespace redco {
namespace {

// Elements per task: large enough that a task's memory traffic (~200 KiB for
// Adam's four streams) dwarfs the scheduling cost; smaller tensors run inline.
constexpr int64_t kGrain = 1 << 14;

// Element loops over tensors: TBB chunks of kGrain (cpu::parallel_chunks).
template <typename F>
void for_range(int64_t n, F&& f) {
  cpu::parallel_chunks(n, kGrain, f);
}

// Sum of squares in double. Eight independent accumulators break the add
// dependency chain (and let the compiler vectorise without reassociating);
// the deterministic reduce keeps the result bit-identical from run to run.
double sum_squares_serial(const float* x, int64_t begin, int64_t end) {
  double acc[8] = {};
  int64_t i = begin;
  for (; i + 8 <= end; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += double(x[i + j]) * double(x[i + j]);
  for (; i < end; ++i) acc[0] += double(x[i]) * double(x[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// The arguments arrive checked by the op's meta function (ops/meta.hpp): f32,
// the parameter's size.
float* f32(const Tensor& t) { return const_cast<float*>(t.data<float>()); }

}  // namespace

double CpuBackend::sum_of_squares(const Tensor& t) {
  const float* x = f32(t);
  const int64_t n = t.numel();
  if (n <= 2 * kGrain) return sum_squares_serial(x, 0, n);
  return tbb::parallel_deterministic_reduce(
      tbb::blocked_range<int64_t>(0, n, kGrain), 0.0,
      [x](const tbb::blocked_range<int64_t>& r, double acc) {
        return acc + sum_squares_serial(x, r.begin(), r.end());
      },
      std::plus<double>());
}

void CpuBackend::sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdCoeffs& c) {
  float* p = f32(param);
  const float* g = f32(grad);
  float* b = buf.defined() ? f32(buf) : nullptr;
  for_range(param.numel(), [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float gi = g[i] * c.gscale + c.wd * p[i];
      if (b) {
        const float bi = c.fresh ? gi : c.momentum * b[i] + c.damp_keep * gi;
        b[i] = bi;
        gi = c.nesterov ? gi + c.momentum * bi : bi;
      }
      p[i] -= c.lr * gi;
    }
  });
}

// Written with Eigen arrays over L1-sized blocks: a plain loop calling
// std::sqrt stays scalar (sqrt may set errno, so the compiler may not
// vectorise it), and ran the AdamW step of GPT-2 small ~3x slower.
void CpuBackend::adam_update(Tensor& param, const Tensor& grad, Tensor& m_t, Tensor& v_t,
                             const AdamCoeffs& c) {
  float* p = f32(param);
  const float* g = f32(grad);
  float* m = f32(m_t);
  float* v = f32(v_t);
  using Block = Eigen::Map<Eigen::ArrayXf>;
  using CBlock = Eigen::Map<const Eigen::ArrayXf>;
  constexpr int64_t kBlock = 1024;  // 4 streams x 4 KiB stay in L1 between the passes
  for_range(param.numel(), [=](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; b += kBlock) {
      const Eigen::Index len = Eigen::Index(std::min(kBlock, end - b));
      Block pb(p + b, len), mb(m + b, len), vb(v + b, len);
      const CBlock gb(g + b, len);
      mb = c.b1 * mb + c.one_minus_b1 * (gb * c.gscale + c.l2 * pb);
      vb = c.b2 * vb + c.one_minus_b2 * (gb * c.gscale + c.l2 * pb).square();
      pb = pb * c.keep - c.step_size * (mb / (vb.sqrt() / c.bc2_sqrt + c.eps));
    }
  });
}

}  // namespace redco
