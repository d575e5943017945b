#include "redco/data/seq2seq_batch.hpp"

#include <algorithm>

#include "redco/core/error.hpp"

namespace redco::data {

std::vector<std::string> sources(std::span<const TextPair> pairs) {
  std::vector<std::string> out;
  out.reserve(pairs.size());
  for (const TextPair& p : pairs) out.push_back(p.source);
  return out;
}
std::vector<std::string> targets(std::span<const TextPair> pairs) {
  std::vector<std::string> out;
  out.reserve(pairs.size());
  for (const TextPair& p : pairs) out.push_back(p.target);
  return out;
}

std::vector<std::vector<int64_t>> Seq2SeqBatch::source_rows() const {
  const int64_t B = source.shape()[0], T = source.shape()[1];
  const int64_t* ids = source.data<int64_t>();        // [B, T]
  const int64_t* mask = source_mask.data<int64_t>();  // [B, T]
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i)
    for (int64_t t = 0; t < T; ++t)
      if (mask[i * T + t] != 0) rows[size_t(i)].push_back(ids[i * T + t]);
  return rows;
}

Seq2SeqEncoder::Seq2SeqEncoder(Tokenizer tok, int64_t max_length)
    : tok_(std::move(tok)), max_length_(max_length) {
  REDCO_CHECK(max_length >= 2, "Seq2SeqEncoder: max_length must be >= 2 tokens, got {}",
              max_length);
}

Seq2SeqEncoder Seq2SeqEncoder::with_eos(Tokenizer tok, int64_t max_length) {
  Seq2SeqEncoder e(std::move(tok), max_length);
  e.tok_.set_truncation(Truncation{.max_length = max_length - 1});  // room for eos
  const int64_t v = e.tok_.vocab_size();
  e.append_eos_ = true;
  e.ids_ = {.pad = v, .eos = {v + 1}, .decoder_start = v};
  e.vocab_ = (v + 2 + 63) / 64 * 64;
  return e;
}

Seq2SeqEncoder Seq2SeqEncoder::pretrained(Tokenizer tok, int64_t max_length,
                                          const Seq2SeqIds& ids) {
  REDCO_CHECK(!ids.eos.empty() && ids.decoder_start >= 0,
              "Seq2SeqEncoder::pretrained: the checkpoint names no eos_token_id or "
              "decoder_start_token_id (config.json or generation_config.json)");
  Seq2SeqEncoder e(std::move(tok), max_length);
  e.tok_.set_truncation(Truncation{.max_length = max_length});
  e.ids_ = ids;
  e.vocab_ = e.tok_.vocab_size();
  return e;
}

std::vector<std::vector<int64_t>> Seq2SeqEncoder::ids(std::span<const std::string> texts) const {
  const EncodingBatch enc = tok_.encode_batch(texts, /*add_special_tokens=*/true);
  std::vector<std::vector<int64_t>> out(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::span<const int32_t> t = enc[i].ids;
    out[i].assign(t.begin(), t.end());
    if (append_eos_) out[i].push_back(eos_id());
  }
  return out;
}

namespace {
// Rows of ids right-padded with `pad` into i64 [B, T], T the longest row.
Tensor padded(const std::vector<std::vector<int64_t>>& rows, int64_t pad, int64_t shift = 0,
              int64_t first = 0) {
  size_t longest = 1;
  for (const auto& r : rows) longest = std::max(longest, r.size());
  const auto B = int64_t(rows.size()), T = int64_t(longest);
  Tensor t = Tensor::empty({B, T}, DType::i64);
  int64_t* p = t.data<int64_t>();  // [B, T]
  std::fill_n(p, B * T, pad);
  for (int64_t i = 0; i < B; ++i) {
    const auto& r = rows[size_t(i)];
    if (shift) p[i * T] = first;  // the decoder start, then the row but its last id
    std::copy(r.begin(), r.end() - shift * (r.empty() ? 0 : 1), p + i * T + shift);
  }
  return t;
}
}  // namespace

Seq2SeqBatch Seq2SeqEncoder::encode(std::span<const std::string> sources,
                                    std::span<const std::string> targets) const {
  REDCO_CHECK(!sources.empty() && sources.size() == targets.size(),
              "Seq2SeqEncoder::encode: {} sources but {} targets; give one target per source",
              sources.size(), targets.size());
  const auto src = ids(sources), tgt = ids(targets);
  Seq2SeqBatch b;
  b.source = padded(src, pad_id());
  std::vector<std::vector<int64_t>> ones(src.size());
  for (size_t i = 0; i < src.size(); ++i) ones[i].assign(src[i].size(), 1);
  b.source_mask = padded(ones, 0);
  b.labels = padded(tgt, -100);
  b.decoder_in = padded(tgt, pad_id(), 1, decoder_start());
  return b;
}

std::string Seq2SeqEncoder::decode(std::span<const int64_t> ids) const {
  const auto& eos = ids_.eos;
  const auto end = std::find_first_of(ids.begin(), ids.end(), eos.begin(), eos.end());
  std::vector<int64_t> kept;
  const int64_t v = tok_.vocab_size();
  for (auto it = ids.begin(); it != end; ++it)
    if (*it >= 0 && *it < v && *it != pad_id()) kept.push_back(*it);  // ids the tokenizer knows
  return tok_.decode(kept, /*skip_special_tokens=*/true);
}

}  // namespace redco::data
