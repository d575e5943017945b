#include "redco/nn/kv_blocks.hpp"

#include <algorithm>

#include "redco/core/error.hpp"

namespace redco::nn {

KVBlocks::KVBlocks(int64_t rows, int64_t blocks_a_row, int64_t block_tokens, int64_t blocks)
    : block_tokens_(block_tokens), refs_(size_t(blocks), 0) {
  REDCO_CHECK(block_tokens >= 1 && blocks >= 1,
              "KVCache: a paged cache needs blocks of >= 1 tokens and a pool of >= 1 blocks; got "
              "{} tokens a block, {} blocks",
              block_tokens, blocks);
  table_ = Tensor::full({rows, blocks_a_row}, -1.f, DType::i64);
  free_.reserve(size_t(blocks));
  for (int64_t b = blocks - 1; b >= 0; --b) free_.push_back(b);  // block 0 taken first
  scratch_.reserve(size_t(table_.numel()));
}

int64_t KVBlocks::held(int64_t row) const {
  int64_t m = 0;
  while (m < blocks_a_row() && at(row, m) >= 0) ++m;
  return m;
}

void KVBlocks::drop(int64_t block) {
  if (--refs_[size_t(block)] == 0) free_.push_back(block);
}

int64_t KVBlocks::take(int64_t row, int64_t m) {
  REDCO_CHECK(!free_.empty(), "KVCache: the pool's {} blocks are all held", blocks());
  const int64_t block = free_.back();
  free_.pop_back();
  refs_[size_t(block)] = 1;
  int64_t& slot = row_ptr(row)[m];
  if (slot >= 0) drop(slot);
  slot = block;
  return block;
}

void KVBlocks::share(int64_t dst, int64_t src, int64_t n) {
  if (dst == src) return;
  release(dst);
  for (int64_t m = 0; m < n; ++m) {
    const int64_t block = at(src, m);
    REDCO_CHECK(block >= 0, "KVCache: row {} holds {} blocks, not {}", src, m, n);
    ++refs_[size_t(block)];
    row_ptr(dst)[m] = block;
  }
}

void KVBlocks::move(int64_t dst, int64_t src) {
  if (dst == src) return;
  release(dst);
  std::copy_n(row_ptr(src), blocks_a_row(), row_ptr(dst));
  std::fill_n(row_ptr(src), blocks_a_row(), int64_t{-1});
}

void KVBlocks::release(int64_t row) {
  int64_t* r = row_ptr(row);
  for (int64_t m = 0; m < blocks_a_row() && r[m] >= 0; ++m) drop(r[m]), r[m] = -1;
}

void KVBlocks::reorder(const std::vector<int64_t>& rows) {
  const int64_t M = blocks_a_row(), n = int64_t(rows.size());
  const int64_t* t = table_.data<int64_t>();
  scratch_.assign(t, t + n * M);   // the old rows [0, n)
  for (int64_t i = 0; i < n; ++i)  // every new holder first, so no block is freed in between
    for (int64_t m = 0; m < M && scratch_[size_t(rows[size_t(i)] * M + m)] >= 0; ++m)
      ++refs_[size_t(scratch_[size_t(rows[size_t(i)] * M + m)])];
  for (int64_t i = 0; i < n; ++i) {
    release(i);
    std::copy_n(scratch_.begin() + rows[size_t(i)] * M, M, row_ptr(i));
  }
}

}  // namespace redco::nn
