// data::Tokenizer's batches: encode_batch on threads into pooled chunk
// storage (EncodingBatch), and padding.
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "redco/core/error.hpp"
#include "redco/data/tokenizer_impl.hpp"

namespace redco::data {

using tok::Span;

namespace {

size_t padded_length(size_t longest, const Padding& p) {
  size_t n = p.length > 0 ? size_t(p.length) : longest;
  if (p.multiple_of > 0)
    n = (n + size_t(p.multiple_of) - 1) / size_t(p.multiple_of) * size_t(p.multiple_of);
  return n;
}

// Pads one encoding to n tokens: padding has id pad_id, offsets (0, 0),
// attention 0; a longer encoding stays as it is.
void pad_one(data::Encoding& e, size_t n, const Padding& p) {
  if (e.size() >= n) return;
  const size_t k = n - e.size();
  auto grow = [&](auto& v, auto value) {
    v.insert(p.side == Side::right ? v.end() : v.begin(), k, value);
  };
  grow(e.ids, p.pad_id), grow(e.type_ids, p.pad_type_id);
  grow(e.offsets, std::pair<uint32_t, uint32_t>{0, 0});
  grow(e.special_tokens_mask, uint8_t(1)), grow(e.attention_mask, uint8_t(0));
}

}  // namespace

void Tokenizer::pad_one(Encoding& e, const Padding& p) { data::pad_one(e, padded_length(0, p), p); }

// Pads every encoding of the batch to its longest (or the fixed length),
// rounded up to a multiple; each chunk is rebuilt once at its padded size.
void Tokenizer::pad_batch(EncodingBatch& batch, const Padding& p) {
  size_t longest = 0;
  for (const auto& c : batch.chunks_)
    for (size_t r = 0; r + 1 < c.starts.size(); ++r)
      longest = std::max<size_t>(longest, c.starts[r + 1] - c.starts[r]);
  const size_t n = padded_length(longest, p);
  for (auto& c : batch.chunks_) {
    EncodingBatch::Chunk out;
    out.starts.assign(1, 0);
    for (size_t r = 0; r + 1 < c.starts.size(); ++r)
      out.starts.push_back(out.starts.back() +
                           uint32_t(std::max<size_t>(n, c.starts[r + 1] - c.starts[r])));
    const size_t total = out.starts.back();
    out.ids.reserve(total), out.type_ids.reserve(total), out.offsets.reserve(total);
    out.special_tokens_mask.reserve(total), out.attention_mask.reserve(total);
    for (size_t r = 0; r + 1 < c.starts.size(); ++r) {
      const size_t b = c.starts[r], e = c.starts[r + 1],
                   k = out.starts[r + 1] - out.starts[r] - (e - b);
      auto put = [&](const auto& from, auto& to, auto value) {
        if (p.side == Side::left) to.insert(to.end(), k, value);
        to.insert(to.end(), from.begin() + long(b), from.begin() + long(e));
        if (p.side == Side::right) to.insert(to.end(), k, value);
      };
      put(c.ids, out.ids, p.pad_id), put(c.type_ids, out.type_ids, p.pad_type_id);
      put(c.offsets, out.offsets, std::pair<uint32_t, uint32_t>{0, 0});
      put(c.special_tokens_mask, out.special_tokens_mask, uint8_t(1));
      put(c.attention_mask, out.attention_mask, uint8_t(0));
    }
    c = std::move(out);
  }
}

// Texts [c * kChunk, ...) into chunk c: each encoding is appended to a
// per-thread scratch chunk whose buffers are reused, then the chunk takes
// one exactly sized copy of each buffer.
void Tokenizer::encode_chunk(std::span<const std::string_view> texts, bool add_special,
                             EncodingBatch::Chunk& out) const {
  thread_local std::vector<tok::Encoding> seqs;
  thread_local EncodingBatch::Chunk scratch;
  scratch.starts.assign(1, 0);
  scratch.ids.clear(), scratch.type_ids.clear(), scratch.offsets.clear();
  scratch.special_tokens_mask.clear();
  for (std::string_view text : texts) {
    seqs.resize(1);
    impl_->encode_one(text, seqs[0]);
    impl_->finish(seqs, add_special);
    for (const tok::Encoding& s : seqs) {
      scratch.ids.insert(scratch.ids.end(), s.ids.begin(), s.ids.end());
      scratch.type_ids.insert(scratch.type_ids.end(), s.type_ids.begin(), s.type_ids.end());
      for (const Span& o : s.offsets) scratch.offsets.emplace_back(o.begin, o.end);
      scratch.special_tokens_mask.insert(scratch.special_tokens_mask.end(), s.special.begin(),
                                         s.special.end());
    }
    scratch.starts.push_back(uint32_t(scratch.ids.size()));
  }
  auto copy = [](const auto& from, auto& to) { to.assign(from.begin(), from.end()); };
  copy(scratch.starts, out.starts), copy(scratch.ids, out.ids);
  copy(scratch.type_ids, out.type_ids), copy(scratch.offsets, out.offsets);
  copy(scratch.special_tokens_mask, out.special_tokens_mask);
  out.attention_mask.assign(out.ids.size(), 1);
}

EncodingBatch Tokenizer::encode_batch(std::span<const std::string_view> texts,
                                      bool add_special_tokens, int threads) const {
  constexpr size_t K = EncodingBatch::kChunk;
  EncodingBatch batch;
  batch.n_ = texts.size();
  batch.chunks_.resize((texts.size() + K - 1) / K);
  auto body = [&](const tbb::blocked_range<size_t>& r) {
    for (size_t c = r.begin(); c < r.end(); ++c)
      encode_chunk(texts.subspan(c * K, std::min(K, texts.size() - c * K)), add_special_tokens,
                   batch.chunks_[c]);
  };
  const tbb::blocked_range<size_t> all(0, batch.chunks_.size());
  if (threads == 1) {
    body(all);
  } else {
    tbb::task_arena arena(threads > 0 ? threads : tbb::task_arena::automatic);
    arena.execute([&] { tbb::parallel_for(all, body); });
  }
  if (impl_->padding) pad_batch(batch, *impl_->padding);
  return batch;
}

EncodingBatch Tokenizer::encode_batch(std::span<const std::string> texts, bool add_special_tokens,
                                      int threads) const {
  std::vector<std::string_view> views(texts.begin(), texts.end());
  return encode_batch(std::span<const std::string_view>(views), add_special_tokens, threads);
}

EncodingView EncodingBatch::operator[](size_t i) const {
  REDCO_CHECK(i < n_, "EncodingBatch: index {} is out of range (size {})", i, n_);
  const Chunk& c = chunks_[i / kChunk];
  const size_t b = c.starts[i % kChunk], n = c.starts[i % kChunk + 1] - b;
  return {std::span(c.ids).subspan(b, n), std::span(c.type_ids).subspan(b, n),
          std::span(c.offsets).subspan(b, n), std::span(c.special_tokens_mask).subspan(b, n),
          std::span(c.attention_mask).subspan(b, n)};
}

Encoding EncodingView::to_encoding() const {
  return {{ids.begin(), ids.end()},
          {type_ids.begin(), type_ids.end()},
          {offsets.begin(), offsets.end()},
          {special_tokens_mask.begin(), special_tokens_mask.end()},
          {attention_mask.begin(), attention_mask.end()}};
}

}  // namespace redco::data
