#pragma once
// The keys and values of the tokens a batch has seen so far, so generation
// runs each new token through the model once instead of the whole sequence.
//
// One cache serves a whole model: each attention layer finds its own slots
// by its parameter path ("h.3.attn"), allocated on first use as
//   k, v  [batch, kv heads held here, capacity, head_dim]
// (under tensor parallelism a rank caches only its heads). Rows fill
// independently: row b holds length(b) tokens in slots [0, length(b)), so
// prompts of different lengths need no left padding and every row's
// positions are its own. A forward pass with the cache set in nn::Ctx:
//   cache.begin(appended);  // per row, how many of this step's T inputs are real
//   nn::apply(model, params, ids [B, T], ctx);  // layers read and write their slots
//   cache.commit();          // length(b) += appended[b]
// Inputs past a row's real ones (right padding of a ragged prefill) write
// slots that the row's next tokens overwrite; they are never attended to.
// Continuous batching (generation/batcher.hpp) keeps the rows in use at the
// front: set_rows(n) makes the first n of the rows allocated the batch (a
// step's input is then [n, T]), copy_row moves a row's tokens between rows or
// in from another cache (a request prefilled alone), all without allocating
// once the slots exist.
// Paged (Paging): the keys and values live in one pool of blocks of
// `block_tokens` tokens that every row draws from, as many as its tokens
// need (kv_blocks.hpp), so memory follows the tokens held rather than rows x
// capacity. Within one cache copy_row shares the source's blocks instead of
// copying them (a prompt prefix held once), a block held by two rows is
// copied before either writes into it, and move_row hands blocks over. The
// decode kernel reads the blocks where they lie (AttentionExtras::block_table).
// Decoder-only models without a score bias.
// Encoder-decoders: the encoder runs once, on the first step, over one row
// per source; its output (memory) is kept as it is, one row per source, and
// its mask repeated for the cache rows each source serves (beams, return
// sequences: consecutive rows). Each cross-attention layer projects its keys
// and values from the memory then, once per source, and keeps them repeated
// for those rows (a copy, not a projection per beam: set_cross).
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "redco/core/tensor.hpp"
#include "redco/nn/kv_blocks.hpp"

namespace redco::nn {

// A paged cache's pool (KVCache::Paging).
struct KVPaging {
  int64_t block_tokens = 0;  // 0: not paged (rows of `capacity` slots each)
  int64_t blocks = 0;        // in the pool
};

class KVCache {
 public:
  using Paging = KVPaging;
  // dtype: the slots' elements (f32 or bf16); unset: bf16 when the layer's
  // weights are bf16 or int8, else the keys' dtype.
  KVCache(int64_t batch, int64_t capacity, std::optional<DType> dtype = std::nullopt,
          Paging paging = {});

  int64_t batch() const { return batch_; }  // the rows a step runs: the first batch() allocated
  int64_t rows_allocated() const { return rows_allocated_; }
  int64_t capacity() const { return capacity_; }
  const std::optional<DType>& dtype() const { return dtype_; }
  int64_t length(int64_t row) const { return length_[size_t(row)]; }
  std::span<const int64_t> lengths() const { return {length_.data(), size_t(batch_)}; }

  // A step appends appended[b] tokens to row b (its first appended[b] inputs).
  void begin(std::vector<int64_t> appended);
  void commit();
  int64_t appended(int64_t row) const { return pending_[size_t(row)]; }
  bool in_step() const { return in_step_; }
  // Keeps only the rows listed, in that order (beam search): row i becomes old
  // row rows[i]. Runs without allocating when the batch size is unchanged.
  // same_source: each row i and rows[i] have the same encoder input (beams
  // of one prompt), so the cross-attention slots and the encoder output,
  // equal on those rows, are left as they are instead of copied.
  void reorder(const std::vector<int64_t>& rows, bool same_source = false);
  // Forgets every row's tokens (the buffers stay for the next batch).
  void reset();
  // Forgets row's tokens (paged: gives its blocks back), between steps.
  void release_row(int64_t row);
  // Row dst takes src's tokens and src holds none (paged: the blocks change
  // hands; otherwise a copy).
  void move_row(int64_t dst, int64_t src);
  // Row dst, holding length(dst) tokens, takes tokens [length(dst), end) of
  // `from`'s row src (a prompt's rest after a shared prefix). Between steps.
  void append_row(int64_t dst, const KVCache& from, int64_t src, int64_t end);

  bool paged() const { return blocks_ != nullptr; }
  const KVBlocks* blocks() const { return blocks_.get(); }  // paged: the bookkeeping
  // i64 [batch, blocks a row] (paged; else undefined): row b's blocks.
  const Tensor& block_table() const { return table_; }
  // Paged: blocks a step appending appended[b] tokens to row b would take
  // from the pool (new ones, and copies of shared ones written into).
  int64_t blocks_to_append(std::span<const int64_t> appended) const;
  // Makes rows [0, n) the batch (1 <= n <= rows_allocated()), between steps.
  // Rows that join keep the tokens they held (none, unless copied in). For
  // decoder-only models: an encoder-decoder's cache keeps its batch.
  void set_rows(int64_t n);
  // Row dst (of those allocated) takes row src's tokens: of this cache, or of
  // `from` (its slots of every layer, which must match this cache's but for
  // rows and capacity); `tokens` >= 0: only its first `tokens` (a shared
  // prompt prefix). Between steps. Paged, from this cache: dst shares src's blocks.
  void copy_row(int64_t dst, int64_t src) { copy_row(dst, *this, src); }
  void copy_row(int64_t dst, const KVCache& from, int64_t src, int64_t tokens = -1);

  struct Slots {
    // [batch, heads, capacity, head_dim]; paged: [blocks, heads, block_tokens, head_dim]
    Tensor k, v;
  };
  // The self-attention slots of layer `path` for the batch's rows [batch, ...],
  // allocated on first use (for every row allocated) on `device`.
  Slots& self(const std::string& path, int64_t heads, int64_t head_dim, DType dtype,
              Device device = Device::cpu());
  // Writes this step's keys and values [batch, heads, T, head_dim] into s (of
  // self()) after each row's tokens: its appended ones (paged), or all T, the
  // padding past a row's real inputs overwritten by its next tokens.
  void store(Slots& s, const Tensor& k, const Tensor& v);
  // The cross-attention keys and values of layer `path` (empty until set).
  Slots& cross(const std::string& path) { return cross_[path]; }
  // Sets them from keys and values projected from the memory's rows
  // [S, heads, Ts, head_dim] (S divides the batch): each source's row is
  // repeated for the batch / S cache rows it serves.
  Slots& set_cross(const std::string& path, const Tensor& k, const Tensor& v);
  // Rows of encoder output projected into cross-attention keys and values so
  // far, summed over layers (tests read it: sources x layers, not beams).
  int64_t cross_rows_projected() const { return cross_rows_projected_; }
  // The encoder output [S, Ts, d], one row per source, and its mask repeated
  // for the cache rows [batch, Ts] (reorder keeps them for those rows).
  Tensor memory, memory_mask;

  // Per row of this step: key ranges and causal offsets for attention over
  // the slots (i64 [batch] each, rebuilt by begin()).
  const Tensor& key_end() const { return key_end_; }
  const Tensor& causal_offset() const { return causal_offset_; }

 private:
  void view_rows();  // self_'s views and the step tensors for batch_ rows
  // Paged: row's blocks for tokens [len, len + n), taken from the pool, and
  // its block at len copied first if another row holds it too.
  void make_writable(int64_t row, int64_t len, int64_t n);
  // Copies tokens [begin, end) of from's row src into this cache's row dst
  // (its blocks there already), every layer.
  void copy_tokens(int64_t dst, const KVCache& from, int64_t src, int64_t begin, int64_t end);
  // Element offset of token t of row's head h in a layer's slots.
  int64_t offset(const Slots& s, int64_t row, int64_t h, int64_t t) const;
  int64_t run(int64_t t) const;  // tokens stored consecutively from t on (within a block)

  int64_t batch_, rows_allocated_, capacity_;
  std::optional<DType> dtype_;
  std::vector<int64_t> length_, pending_;  // [rows_allocated]; the first batch_ are the batch's
  bool in_step_ = false;
  std::map<std::string, Slots> all_;           // self-attention slots of every allocated row
  std::map<std::string, Slots> self_, cross_;  // self_: all_'s first batch_ rows (views)
  Tensor all_key_end_, all_causal_offset_;     // [rows_allocated] i64
  Tensor key_end_, causal_offset_;             // their first batch_ (views)
  std::map<size_t, Tensor> scratch_;           // reorder's copies by byte size, reused
  std::unique_ptr<KVBlocks> blocks_;           // paged: the pool's bookkeeping
  Tensor table_;                               // paged: blocks_'s table, the first batch_ rows
  int64_t cross_rows_projected_ = 0;
};

}  // namespace redco::nn
