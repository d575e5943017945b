#include "redco/ops/paged_kv.hpp"

#include "redco/core/device_memory.hpp"
#include "redco/core/error.hpp"

namespace redco {

void check_paged_kv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Tensor& table) {
  REDCO_CHECK(table.dtype() == DType::i64 && table.rank() == 2 && table.device().is_cpu(),
              "{}: a paged KV cache's block table must be an i64 [batch, blocks] CPU tensor, got "
              "{} {} on {}",
              op, dtype_name(table.dtype()), table.shape(), table.device().str());
  REDCO_CHECK(q.rank() == 4 && k.rank() == 4 && k.shape() == v.shape() &&
                  q.dim(0) == table.dim(0) && q.dim(3) == k.dim(3) && k.dim(1) > 0 &&
                  q.dim(1) % k.dim(1) == 0 && k.dim(2) > 0,
              "{}: a paged KV cache needs q [B, Hq, Tq, D], k and v pools [blocks, Hkv, block, D] "
              "(Hq a multiple of Hkv) and a block table [B, blocks a row]; got q {}, k {}, v {}, "
              "table {}",
              op, q.shape(), k.shape(), v.shape(), table.shape());
  const int64_t* t = table.data<int64_t>();
  for (int64_t i = 0; i < table.numel(); ++i)
    REDCO_CHECK(t[i] >= -1 && t[i] < k.dim(0),
                "{}: the block table names block {}, but the pool holds {} (-1: none)", op, t[i],
                k.dim(0));
}

Tensor gather_paged_kv(const Tensor& pool, const Tensor& table) {
  const int64_t B = table.dim(0), M = table.dim(1), H = pool.dim(1), block = pool.dim(2),
                D = pool.dim(3);
  const Device dev = pool.device();
  Tensor rows = Tensor::zeros({B, H, M * block, D}, pool.dtype(), dev);
  const size_t run = size_t(block * D) * dtype_size(pool.dtype());  // one block of one head
  auto* dst = static_cast<char*>(rows.device_ptr());
  const auto* src = static_cast<const char*>(pool.device_ptr());
  const int64_t* t = table.data<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t m = 0; m < M; ++m) {
      if (t[b * M + m] < 0) continue;
      for (int64_t h = 0; h < H; ++h)
        copy_bytes(dst + size_t((b * H + h) * M + m) * run, dev,
                   src + size_t(t[b * M + m] * H + h) * run, dev, run);
    }
  return rows;
}

}  // namespace redco
