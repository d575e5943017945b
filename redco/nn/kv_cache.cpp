#include "redco/nn/kv_cache.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "redco/core/allocator.hpp"
#include "redco/core/device_memory.hpp"
#include "redco/core/error.hpp"

namespace redco::nn {

namespace {
// t's rows (dim 0) repeated `copies` times each, consecutively.
Tensor repeat_rows(const Tensor& t, int64_t copies) {
  if (!t.defined() || copies == 1) return t;
  const Tensor src = t.to(Device::cpu());
  Shape shape = src.shape();
  shape[0] *= copies;
  Tensor out = Tensor::empty(shape, src.dtype());
  const size_t row = size_t(src.numel() / src.dim(0)) * dtype_size(src.dtype());
  for (int64_t r = 0; r < shape[0]; ++r)
    std::memcpy(static_cast<char*>(out.raw()) + size_t(r) * row,
                static_cast<const char*>(src.raw()) + size_t(r / copies) * row, row);
  return t.device().is_cpu() ? out : out.to(t.device());
}

// t[i] = old t[rows[i]] along dim 0, through `scratch` (a copy of t).
void gather_rows(Tensor& t, std::map<size_t, Tensor>& scratches, const std::vector<int64_t>& rows) {
  if (!t.defined()) return;
  Tensor& scratch = scratches[size_t(t.numel()) * dtype_size(t.dtype())];
  const Device dev = t.device();  // rows move where they live: memcpy on the CPU
  if (!scratch.defined() || scratch.device() != dev)
    scratch = Tensor::empty(t.shape(), t.dtype(), dev);
  const size_t row_bytes = size_t(t.numel() / t.dim(0)) * dtype_size(t.dtype());
  copy_bytes(scratch.device_ptr(), dev, t.device_ptr(), dev, row_bytes * size_t(t.dim(0)));
  auto* dst = static_cast<char*>(t.device_ptr());
  const auto* src = static_cast<const char*>(scratch.device_ptr());
  for (size_t i = 0; i < rows.size(); ++i)
    copy_bytes(dst + i * row_bytes, dev, src + size_t(rows[i]) * row_bytes, dev, row_bytes);
}
}  // namespace

KVCache::KVCache(int64_t batch, int64_t capacity, std::optional<DType> dtype, Paging paging)
    : batch_(batch),
      rows_allocated_(batch),
      capacity_(capacity),
      dtype_(dtype),
      length_(size_t(batch), 0),
      pending_(size_t(batch), 0) {
  REDCO_CHECK(batch >= 1 && capacity >= 1, "KVCache: batch {} and capacity {} must be >= 1", batch,
              capacity);
  all_key_end_ = Tensor::zeros({batch}, DType::i64);
  all_causal_offset_ = Tensor::zeros({batch}, DType::i64);
  if (paging.block_tokens > 0)
    blocks_ = std::make_unique<KVBlocks>(batch,
                                         (capacity + paging.block_tokens - 1) / paging.block_tokens,
                                         paging.block_tokens, paging.blocks);
  view_rows();
}

void KVCache::view_rows() {
  key_end_ = all_key_end_.slice0(0, batch_);
  causal_offset_ = all_causal_offset_.slice0(0, batch_);
  if (paged()) {  // the pools serve every row
    table_ = blocks_->table().slice0(0, batch_);
    return;
  }
  for (auto& [path, all] : all_)
    self_[path] = Slots{all.k.slice0(0, batch_), all.v.slice0(0, batch_)};
}

void KVCache::set_rows(int64_t n) {
  REDCO_CHECK(!in_step_, "KVCache::set_rows: between steps only");
  REDCO_CHECK(n >= 1 && n <= rows_allocated_,
              "KVCache::set_rows: {} rows, but the cache holds {} (1 to {})", n, rows_allocated_,
              rows_allocated_);
  REDCO_CHECK(cross_.empty() && !memory.defined(),
              "KVCache::set_rows: an encoder-decoder's cache keeps its batch");
  if (n == batch_) return;
  batch_ = n;
  view_rows();
}

void KVCache::copy_row(int64_t dst, const KVCache& from, int64_t src, int64_t tokens) {
  REDCO_CHECK(!in_step_ && !from.in_step_, "KVCache::copy_row: between steps only");
  REDCO_CHECK(dst >= 0 && dst < rows_allocated_ && src >= 0 && src < from.rows_allocated_,
              "KVCache::copy_row: row {} of {} from row {} of {}", dst, rows_allocated_, src,
              from.rows_allocated_);
  REDCO_CHECK(tokens <= from.length_[size_t(src)],
              "KVCache::copy_row: {} tokens asked of a row holding {}", tokens,
              from.length_[size_t(src)]);
  const int64_t len = tokens >= 0 ? tokens : from.length_[size_t(src)];
  REDCO_CHECK(len <= capacity_, "KVCache::copy_row: {} tokens into a capacity of {}", len,
              capacity_);
  if (&from == this && (dst == src || paged())) {  // the same tokens: shared, or kept
    if (dst != src) blocks_->share(dst, src, blocks_->blocks_for(len));
    length_[size_t(dst)] = len;
    return;
  }
  release_row(dst);
  append_row(dst, from, src, len);
}

void KVCache::append_row(int64_t dst, const KVCache& from, int64_t src, int64_t end) {
  const int64_t begin = length_[size_t(dst)];
  REDCO_CHECK(!in_step_ && !from.in_step_ && begin <= end && end <= from.length_[size_t(src)] &&
                  end <= capacity_,
              "KVCache::append_row: tokens [{}, {}) of a row holding {} into a capacity of {}, "
              "between steps",
              begin, end, from.length_[size_t(src)], capacity_);
  make_writable(dst, begin, end - begin);
  copy_tokens(dst, from, src, begin, end);
  length_[size_t(dst)] = end;
}

void KVCache::release_row(int64_t row) {
  REDCO_CHECK(!in_step_ && row >= 0 && row < rows_allocated_,
              "KVCache::release_row: row {} of {}, between steps", row, rows_allocated_);
  if (paged()) blocks_->release(row);
  length_[size_t(row)] = 0;
}

void KVCache::move_row(int64_t dst, int64_t src) {
  if (dst == src) return;
  if (!paged()) {
    copy_row(dst, src);
  } else {
    REDCO_CHECK(!in_step_ && dst >= 0 && dst < rows_allocated_ && src >= 0 && src < rows_allocated_,
                "KVCache::move_row: rows {} and {} of {}, between steps", dst, src,
                rows_allocated_);
    blocks_->move(dst, src);
    length_[size_t(dst)] = length_[size_t(src)];
  }
  length_[size_t(src)] = 0;
}

int64_t KVCache::offset(const Slots& s, int64_t row, int64_t h, int64_t t) const {
  const int64_t H = s.k.dim(1), D = s.k.dim(3);
  if (!paged()) return ((row * H + h) * s.k.dim(2) + t) * D;
  const int64_t bt = blocks_->block_tokens();
  return ((blocks_->at(row, t / bt) * H + h) * bt + t % bt) * D;
}

int64_t KVCache::run(int64_t t) const {
  return paged() ? blocks_->block_tokens() - t % blocks_->block_tokens()
                 : std::numeric_limits<int64_t>::max();
}

void KVCache::copy_tokens(int64_t dst, const KVCache& from, int64_t src, int64_t begin,
                          int64_t end) {
  for (const auto& [path, in] : from.all_) {
    const int64_t H = in.k.dim(1), D = in.k.dim(3);
    self(path, H, D, in.k.dtype(), in.k.device());  // allocates on first use
    const Slots& out = all_.at(path);
    REDCO_CHECK(out.k.dtype() == in.k.dtype() && out.k.dim(1) == H && out.k.dim(3) == D,
                "KVCache: layer '{}' holds {} {} here but {} {} in the source", path,
                dtype_name(out.k.dtype()), out.k.shape(), dtype_name(in.k.dtype()), in.k.shape());
    const size_t es = dtype_size(in.k.dtype());
    const Device dev = out.k.device(), dev_in = in.k.device();
    for (auto [o, i] : {std::pair{&out.k, &in.k}, std::pair{&out.v, &in.v}})
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = begin, n; t < end; t += n) {  // runs within both sides' blocks
          n = std::min({end - t, run(t), from.run(t)});
          copy_bytes(
              static_cast<char*>(o->device_ptr()) + size_t(offset(out, dst, h, t)) * es, dev,
              static_cast<const char*>(i->device_ptr()) + size_t(from.offset(in, src, h, t)) * es,
              dev_in, size_t(n * D) * es);
        }
  }
}

void KVCache::make_writable(int64_t row, int64_t len, int64_t n) {
  if (!paged() || n <= 0) return;
  KVBlocks& kb = *blocks_;
  const int64_t bt = kb.block_tokens();
  for (int64_t m = len / bt; m < kb.blocks_for(len + n); ++m) {
    const int64_t old = kb.at(row, m);
    if (old >= 0 && !kb.shared(old)) continue;  // the row's own
    REDCO_CHECK(kb.free_blocks() > 0,
                "KVCache: the pool's {} blocks of {} tokens are all held; give the paged cache "
                "more blocks (KVCache::Paging::blocks) or hold fewer tokens",
                kb.blocks(), bt);
    const int64_t block = kb.take(row, m);  // a shared one stays with its other rows
    if (old < 0 || m * bt >= len) continue;
    for (const auto& [path, pool] : all_)  // the row's tokens before len: a copy of the block
      for (const Tensor* t : {&pool.k, &pool.v}) {
        const size_t bytes = size_t(t->numel() / t->dim(0)) * dtype_size(t->dtype());
        auto* base = static_cast<char*>(t->device_ptr());
        copy_bytes(base + size_t(block) * bytes, t->device(), base + size_t(old) * bytes,
                   t->device(), bytes);
      }
  }
}

int64_t KVCache::blocks_to_append(std::span<const int64_t> appended) const {
  if (!paged()) return 0;
  const int64_t bt = blocks_->block_tokens();
  int64_t need = 0;
  for (size_t b = 0; b < appended.size(); ++b) {
    const int64_t len = length_[b];
    for (int64_t m = len / bt; m < blocks_->blocks_for(len + appended[b]); ++m) {
      const int64_t old = blocks_->at(int64_t(b), m);
      need += old < 0 || blocks_->shared(old);
    }
  }
  return need;
}

void KVCache::begin(std::vector<int64_t> appended) {
  REDCO_CHECK(!in_step_, "KVCache::begin: the previous step was not committed");
  REDCO_CHECK(int64_t(appended.size()) == batch_, "KVCache::begin: {} counts for {} rows",
              appended.size(), batch_);
  int64_t* end = key_end_.data<int64_t>();
  int64_t* off = causal_offset_.data<int64_t>();
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t n = appended[size_t(b)], len = length_[size_t(b)];
    REDCO_CHECK(n >= 0 && len + n <= capacity_,
                "KVCache: row {} would hold {} tokens, more than the cache's capacity {}; make "
                "the cache larger (prompt length + max new tokens)",
                b, len + n, capacity_);
    make_writable(b, len, n);
    end[b] = len + n, off[b] = len;
  }
  std::copy(appended.begin(), appended.end(), pending_.begin());
  in_step_ = true;
}

void KVCache::commit() {
  REDCO_CHECK(in_step_, "KVCache::commit: no step begun");
  for (int64_t b = 0; b < batch_; ++b) length_[size_t(b)] += pending_[size_t(b)];
  in_step_ = false;
}

KVCache::Slots& KVCache::set_cross(const std::string& path, const Tensor& k, const Tensor& v) {
  const int64_t sources = k.dim(0);
  REDCO_CHECK(sources > 0 && batch_ % sources == 0 && v.dim(0) == sources,
              "KVCache: cross-attention '{}' projected {} rows of encoder output for a cache of {} "
              "rows; each source needs the same number of rows",
              path, sources, batch_);
  cross_rows_projected_ += sources;
  REDCO_CHECK(!paged(),
              "KVCache: a paged cache serves decoder-only models ('{}' attends to an "
              "encoder's output)",
              path);
  CachingAllocator::LongLivedScope long_lived;  // lives as long as the generation
  Slots& s = cross_[path];
  s.k = repeat_rows(k, batch_ / sources), s.v = repeat_rows(v, batch_ / sources);
  return s;
}

void KVCache::reset() {
  if (paged())
    for (int64_t r = 0; r < rows_allocated_; ++r) blocks_->release(r);
  std::fill(length_.begin(), length_.end(), 0);
  in_step_ = false;
  cross_.clear();
  memory = Tensor(), memory_mask = Tensor();
}

KVCache::Slots& KVCache::self(const std::string& path, int64_t heads, int64_t head_dim, DType dtype,
                              Device device) {
  Slots& all = all_[path];
  if (!all.k.defined()) {
    CachingAllocator::LongLivedScope long_lived;  // lives as long as the generation
    const Shape shape = paged() ? Shape{blocks_->blocks(), heads, blocks_->block_tokens(), head_dim}
                                : Shape{rows_allocated_, heads, capacity_, head_dim};
    all.k = Tensor::empty(shape, dtype, device);
    all.v = Tensor::empty(shape, dtype, device);
    self_[path] = paged() ? all : Slots{all.k.slice0(0, batch_), all.v.slice0(0, batch_)};
  }
  Slots& s = self_.at(path);
  const Shape want = paged() ? Shape{blocks_->blocks(), heads, blocks_->block_tokens(), head_dim}
                             : Shape{batch_, heads, capacity_, head_dim};
  REDCO_CHECK(s.k.shape() == want && s.k.device() == device,
              "KVCache: layer '{}' cached {} on {} but now needs {} on {}", path, s.k.shape(),
              s.k.device().str(), want, device.str());
  return s;
}

void KVCache::store(Slots& s, const Tensor& k, const Tensor& v) {
  REDCO_CHECK(in_step_ && k.dim(0) == batch_ && k.shape() == v.shape(),
              "KVCache::store: keys {} and values {} for {} rows, in a step", k.shape(), v.shape(),
              batch_);
  for (int64_t b = 0; b < batch_; ++b)
    REDCO_CHECK(pending_[size_t(b)] <= k.dim(2),
                "KVCache::store: row {} appends {} tokens but the step has {}", b,
                pending_[size_t(b)], k.dim(2));
  for (auto [kv, slots] : {std::pair{&k, &s.k}, std::pair{&v, &s.v}}) {
    const int64_t H = kv->dim(1), T = kv->dim(2), D = kv->dim(3);
    const Tensor in = kv->dtype() == slots->dtype() ? *kv : kv->to(slots->dtype());
    const size_t es = dtype_size(slots->dtype());
    const Device dev = slots->device();  // the caller placed the slots where the keys are
    const auto* src = static_cast<const char*>(in.device_ptr());
    auto* dst = static_cast<char*>(slots->device_ptr());
    for (int64_t b = 0; b < batch_; ++b) {
      const int64_t len = length_[size_t(b)];
      // Paged: the real inputs only (padding has no block); otherwise all
      // that fit, the padding overwritten by the row's next tokens.
      const int64_t n = paged() ? pending_[size_t(b)] : std::min(T, capacity_ - len);
      for (int64_t h = 0; h < H; ++h)  // a memcpy on the CPU, a device copy elsewhere
        for (int64_t t = 0, c; t < n; t += c) {
          c = std::min(n - t, run(len + t));
          copy_bytes(dst + size_t(offset(s, b, h, len + t)) * es, dev,
                     src + size_t(((b * H + h) * T + t) * D) * es, dev, size_t(c * D) * es);
        }
    }
  }
}

void KVCache::reorder(const std::vector<int64_t>& rows, bool same_source) {
  REDCO_CHECK(!in_step_ && int64_t(rows.size()) == batch_,
              "KVCache::reorder: {} rows for a batch of {} (between steps)", rows.size(), batch_);
  for (int64_t r : rows) REDCO_CHECK(r >= 0 && r < batch_, "KVCache::reorder: no row {}", r);
  if (paged()) blocks_->reorder(rows);  // blocks change hands; the pools stay
  for (auto* slots : {&self_, &cross_}) {
    if (slots == &self_ && paged()) continue;
    if (slots == &cross_ && same_source) continue;
    for (auto& [path, s] : *slots) {
      gather_rows(s.k, scratch_, rows);
      gather_rows(s.v, scratch_, rows);
    }
  }
  if (!same_source) {
    // Rows may change source: the memory, one row per source, is repeated
    // for every cache row first (rare: beam search keeps its sources).
    if (memory.defined() && memory.dim(0) != batch_)
      memory = repeat_rows(memory, batch_ / memory.dim(0));
    gather_rows(memory, scratch_, rows);
    gather_rows(memory_mask, scratch_, rows);
  }
  std::vector<int64_t> len = length_;
  for (size_t r = 0; r < rows.size(); ++r) len[r] = length_[size_t(rows[r])];
  length_ = std::move(len);
}

}  // namespace redco::nn

namespace redco::nn {

const Tensor& cached_memory(const KVCache& cache) { return cache.memory; }
const Tensor& cached_memory_mask(const KVCache& cache) { return cache.memory_mask; }
void cache_memory(KVCache& cache, const Tensor& memory, const Tensor& mask) {
  const int64_t sources = memory.dim(0);
  REDCO_CHECK(sources > 0 && cache.batch() % sources == 0,
              "encoder_decoder: {} sources for a KV cache of {} rows; each source needs the same "
              "number of rows (1, or its beams / return sequences, consecutive)",
              sources, cache.batch());
  CachingAllocator::LongLivedScope long_lived;  // lives as long as the generation
  cache.memory = memory;  // the cross-attention layers project each source once
  cache.memory_mask = repeat_rows(mask, cache.batch() / sources);
}
}  // namespace redco::nn
