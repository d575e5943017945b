#include "redco/nn/kv_cache.hpp"

#include <cstring>

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

KVCache::KVCache(int64_t batch, int64_t capacity, std::optional<DType> dtype)
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
  view_rows();
}

void KVCache::view_rows() {
  key_end_ = all_key_end_.slice0(0, batch_);
  causal_offset_ = all_causal_offset_.slice0(0, batch_);
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
  for (const auto& [path, in] : from.all_) {
    const int64_t H = in.k.dim(1), D = in.k.dim(3), cap_in = in.k.dim(2);
    self(path, H, D, in.k.dtype(), in.k.device());  // allocates on first use
    const Slots& out = all_.at(path);
    REDCO_CHECK(out.k.dtype() == in.k.dtype(),
                "KVCache::copy_row: layer '{}' holds {} here but {} in the source", path,
                dtype_name(out.k.dtype()), dtype_name(in.k.dtype()));
    const size_t es = dtype_size(in.k.dtype()), n = size_t(len * D) * es;
    const Device dev = out.k.device(), dev_in = in.k.device();
    for (auto [o, i] : {std::pair{&out.k, &in.k}, std::pair{&out.v, &in.v}})
      for (int64_t h = 0; h < H; ++h)  // [heads, capacity, head_dim] per row: a copy per head
        copy_bytes(
            static_cast<char*>(o->device_ptr()) + size_t((dst * H + h) * capacity_ * D) * es, dev,
            static_cast<const char*>(i->device_ptr()) + size_t((src * H + h) * cap_in * D) * es,
            dev_in, n);
  }
  length_[size_t(dst)] = len;
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
  CachingAllocator::LongLivedScope long_lived;  // lives as long as the generation
  Slots& s = cross_[path];
  s.k = repeat_rows(k, batch_ / sources), s.v = repeat_rows(v, batch_ / sources);
  return s;
}

void KVCache::reset() {
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
    const Shape shape{rows_allocated_, heads, capacity_, head_dim};
    all.k = Tensor::empty(shape, dtype, device);
    all.v = Tensor::empty(shape, dtype, device);
    self_[path] = Slots{all.k.slice0(0, batch_), all.v.slice0(0, batch_)};
  }
  Slots& s = self_.at(path);
  REDCO_CHECK(s.k.shape() == (Shape{batch_, heads, capacity_, head_dim}) && s.k.device() == device,
              "KVCache: layer '{}' cached {} on {} but now needs [{}, {}, {}, {}] on {}", path,
              s.k.shape(), s.k.device().str(), batch_, heads, capacity_, head_dim, device.str());
  return s;
}

void KVCache::reorder(const std::vector<int64_t>& rows, bool same_source) {
  REDCO_CHECK(!in_step_ && int64_t(rows.size()) == batch_,
              "KVCache::reorder: {} rows for a batch of {} (between steps)", rows.size(), batch_);
  for (int64_t r : rows) REDCO_CHECK(r >= 0 && r < batch_, "KVCache::reorder: no row {}", r);
  for (auto* slots : {&self_, &cross_}) {
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
