#pragma once
// The bookkeeping of a paged KV cache (kv_cache.hpp): which blocks of the
// pool each row holds, in order, how many rows hold each block, and which
// blocks are free. Rows share blocks (a prompt prefix held once for every
// request that starts with it); a block held by more than one row is copied
// before any of them writes into it (KVCache does that). Nothing here
// allocates after construction: a decoded token takes a block off the free
// list at most.
#include <cstdint>
#include <vector>

#include "redco/core/tensor.hpp"

namespace redco::nn {

class KVBlocks {
 public:
  KVBlocks(int64_t rows, int64_t blocks_a_row, int64_t block_tokens, int64_t blocks);

  int64_t block_tokens() const { return block_tokens_; }
  int64_t blocks() const { return int64_t(refs_.size()); }  // in the pool
  int64_t free_blocks() const { return int64_t(free_.size()); }
  int64_t blocks_a_row() const { return table_.dim(1); }
  // The blocks a row needs for `tokens` tokens.
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_tokens_ - 1) / block_tokens_; }

  // i64 [rows, blocks a row]: row r's m-th block, -1 where it holds none.
  const Tensor& table() const { return table_; }
  int64_t at(int64_t row, int64_t m) const {
    return table_.data<int64_t>()[row * blocks_a_row() + m];
  }
  int64_t held(int64_t row) const;  // blocks row holds (its first, consecutive)
  bool shared(int64_t block) const { return refs_[size_t(block)] > 1; }

  // Row's m-th block becomes a free block, taken (the one it held before, if
  // any, dropped); returns it. The caller checked free_blocks().
  int64_t take(int64_t row, int64_t m);
  // Row dst holds src's first n blocks as well (its own dropped first).
  void share(int64_t dst, int64_t src, int64_t n);
  // dst takes src's blocks (its own dropped first); src holds none.
  void move(int64_t dst, int64_t src);
  // Row holds no block (each dropped: free when no other row holds it).
  void release(int64_t row);
  // Row i holds what row rows[i] held (beam search); rows outside `rows`'s
  // range keep theirs. Allocates nothing (its copy of the table is kept).
  void reorder(const std::vector<int64_t>& rows);

 private:
  void drop(int64_t block);
  int64_t* row_ptr(int64_t row) { return table_.data<int64_t>() + row * blocks_a_row(); }

  int64_t block_tokens_;
  Tensor table_;                  // i64 [rows, blocks a row]
  std::vector<int32_t> refs_;     // [blocks]: rows holding each
  std::vector<int64_t> free_;     // blocks no row holds (a stack)
  std::vector<int64_t> scratch_;  // reorder's copy of the table
};

}  // namespace redco::nn
