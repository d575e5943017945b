// Continuous batching (batcher.hpp): admit, prefill alone, decode together,
// release rows.
#include "redco/generation/batcher.hpp"

#include <algorithm>
#include <cereal/archives/binary.hpp>
#include <cereal/types/optional.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <limits>
#include <sstream>

#include "redco/core/error.hpp"
#include "redco/core/philox.hpp"
#include "redco/generation/steps.hpp"

namespace redco::generation {

std::string_view finish_name(Finish f) {
  switch (f) {
    case Finish::stop:
      return "stop";
    case Finish::length:
      return "length";
    case Finish::cancelled:
      return "cancelled";
    case Finish::error:
      return "error";
  }
  return "?";
}

struct Batcher::Request {
  int64_t id = 0;
  std::vector<int64_t> prompt;
  GenerationConfig config;
  RequestEvents events;
  RowHistory hist;
  int64_t reserve = 0;                          // KV blocks it may fill
  int64_t prefilled = 0;                        // prompt tokens in prefill_ so far
  uint64_t stream = 0;                          // its random stream (row_stream)
  std::optional<data::Tokenizer::Stream> text;  // the decoder, primed with the prompt
  std::string held;                             // text not given yet: may begin a stop
  bool cancelled = false, ended = false;
  bool muted = false;         // lockstep: on_token said stop; no event until the cancel lands
  bool stop_matched = false;  // a stop string ended it: the text after it is dropped
};

namespace {
// The longest end of `text` that is the beginning of a stop string (and so
// may still become one): that much is held back.
size_t stop_prefix_at_end(std::string_view text, const std::vector<std::string>& stops) {
  size_t keep = 0;
  for (const std::string& s : stops)
    for (size_t n = std::min(s.size() - 1, text.size()); n > keep; --n)
      if (text.substr(text.size() - n) == std::string_view(s).substr(0, n)) {
        keep = n;
        break;
      }
  return keep;
}

// The paged cache's pool: unless kv_tokens says otherwise, every row able to
// fill the context and as much again for each stored prompt.
nn::KVPaging paging_of(const BatcherOptions& o) {
  REDCO_CHECK(o.kv_block >= 1 && o.kv_tokens >= 0 && o.slots >= 1 && o.context >= 2,
              "Batcher: kv_block {} (>= 1), kv_tokens {} (>= 0), slots {} (>= 1) and context {} "
              "(>= 2)",
              o.kv_block, o.kv_tokens, o.slots, o.context);
  auto blocks_for = [&](int64_t tokens) { return (tokens + o.kv_block - 1) / o.kv_block; };
  if (o.kv_tokens > 0) return {o.kv_block, blocks_for(o.kv_tokens)};
  // Whole blocks per row: a full row takes blocks_for(context) of them.
  return {o.kv_block, (o.slots + std::max<int64_t>(o.prefix_rows, 0)) * blocks_for(o.context)};
}

// Where the first stop string begins in `text` (npos: none).
size_t first_stop(std::string_view text, const std::vector<std::string>& stops) {
  size_t at = std::string_view::npos;
  for (const std::string& s : stops)
    if (!s.empty()) at = std::min(at, text.find(s));
  return at;
}
}  // namespace

Batcher::Batcher(StepFn step, BatcherOptions options, const data::Tokenizer* tokenizer, nn::Ctx ctx)
    : step_(std::move(step)),
      options_(options),
      tokenizer_(tokenizer),
      ctx_(std::move(ctx)),
      cache_(options.slots + std::max<int64_t>(options.prefix_rows, 0) + 1, options.context,
             options.cache_dtype, paging_of(options)),
      prefill_(1, options.context, options.cache_dtype) {
  REDCO_CHECK(options.max_queue >= 0 && options.prefix_rows >= 0,
              "Batcher: max_queue {} and prefix_rows {} (>= 0)", options.max_queue,
              options.prefix_rows);
  ctx_.train = false;
  next_ = Tensor::zeros({options.slots, 1}, DType::i64);
  rows_.reserve(size_t(options.slots));
  prefix_tokens_.resize(size_t(options.prefix_rows));
  prefix_used_.resize(size_t(options.prefix_rows));
  kv_blocks_ = cache_.blocks()->blocks();
  count_blocks();
}

Batcher::~Batcher() = default;

std::optional<int64_t> Batcher::submit(std::vector<int64_t> prompt, GenerationConfig config,
                                       RequestEvents events) {
  check(config, options_.vocab_size);
  const auto n = int64_t(prompt.size());
  REDCO_CHECK(n > 0, "the prompt is empty: it needs at least one token");
  REDCO_CHECK(config.num_beams == 1 && config.num_return_sequences == 1,
              "continuous batching runs one sequence per request: num_beams {} and "
              "num_return_sequences {} must be 1",
              config.num_beams, config.num_return_sequences);
  REDCO_CHECK(n < options_.context,
              "the prompt has {} tokens but the context holds {} (prompt and new tokens): "
              "shorten it",
              n, options_.context);
  REDCO_CHECK(config.stop_strings.empty() || tokenizer_,
              "stop strings need the tokenizer (this batcher has ids only)");
  if (options_.vocab_size > 0)
    for (int64_t t : prompt)
      REDCO_CHECK(t >= 0 && t < options_.vocab_size,
                  "prompt token {} is not in the vocabulary of {} ids", t, options_.vocab_size);
  auto r = make_request(std::move(prompt), std::move(config), std::move(events));
  std::lock_guard lock(mutex_);
  // Room: a free row for each, and max_queue more that wait for one.
  if (int64_t(inbox_.size()) + waiting_count_ >= options_.max_queue + free_rows())
    return std::nullopt;
  r->id = next_id_++;
  const int64_t id = r->id;
  inbox_.push_back(std::move(r));
  work_.notify_one();
  return id;
}

std::unique_ptr<Batcher::Request> Batcher::make_request(std::vector<int64_t> prompt,
                                                        GenerationConfig config,
                                                        RequestEvents events) const {
  const auto n = int64_t(prompt.size());
  // The most it may hold: its prompt and every token it may draw.
  const int64_t most =
      n + std::min(std::max<int64_t>(config.max_new_tokens, 1), options_.context - n);
  const int64_t reserve = cache_.blocks()->blocks_for(most);
  const int64_t block = cache_.blocks()->block_tokens();
  REDCO_CHECK(reserve <= kv_blocks_,
              "the request may hold {} tokens (a prompt of {} and up to {} new), more than the KV "
              "cache's {} ({} blocks of {}): ask for fewer tokens, or give the cache more "
              "(kv_tokens; redco-serve --kv-cache-tokens)",
              most, n, most - n, kv_blocks_ * block, kv_blocks_, block);
  auto r = std::make_unique<Request>();
  r->reserve = reserve;
  r->prompt = std::move(prompt);
  r->config = std::move(config);
  r->events = std::move(events);
  r->stream = detail::row_stream(r->prompt, 0);
  return r;
}

void Batcher::cancel(int64_t id) {
  std::lock_guard lock(mutex_);
  cancelled_ids_.push_back(id);
  work_.notify_one();
}

int64_t Batcher::queued() const {
  std::lock_guard lock(mutex_);
  return int64_t(inbox_.size()) + waiting_count_;
}

void Batcher::wait_for_work(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  work_.wait_for(lock, timeout, [&] {
    return stop_waiting_ || !inbox_.empty() || waiting_count_ > 0 || !rows_.empty() ||
           prefilling_ || !cancelled_ids_.empty();
  });
}

void Batcher::stop_waiting() {
  std::lock_guard lock(mutex_);
  stop_waiting_ = true;
  work_.notify_all();
}

bool Batcher::step() {
  NoGradGuard no_grad;
  // What arrived since the last step, and the cancellations: under the lock
  // at once (a cancel names a request submitted before it).
  std::vector<std::unique_ptr<Request>> arrived;
  std::vector<int64_t> cancels;
  {
    std::lock_guard lock(mutex_);
    for (; !inbox_.empty(); inbox_.pop_front()) arrived.push_back(std::move(inbox_.front()));
    cancels.swap(cancelled_ids_);
  }
  if (exchange_ && !share_step(arrived, cancels, false)) return false;
  for (auto& r : arrived) waiting_.push_back(std::move(r));
  for (int64_t id : cancels) {
    for (auto& r : rows_)
      if (r->id == id) r->cancelled = true;
    for (auto& r : waiting_)
      if (r->id == id) r->cancelled = true;
    if (prefilling_ && prefilling_->id == id) prefilling_->cancelled = true;
  }
  // A cancelled request that waits ends now, not when it would have had a row.
  for (auto it = waiting_.begin(); it != waiting_.end();)
    if ((*it)->cancelled) {
      finish(**it, Finish::cancelled);
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  waiting_count_ = int64_t(waiting_.size());
  for (auto& r : rows_)
    if (r->cancelled && !r->ended) finish(*r, Finish::cancelled);
  release_finished();
  const bool had_work = !rows_.empty() || prefilling_ || !waiting_.empty();
  admit();
  waiting_count_ = int64_t(waiting_.size());
  if (!rows_.empty()) decode();
  count_blocks();
  return had_work;
}

void Batcher::count_blocks() {
  const nn::KVBlocks& kb = *cache_.blocks();
  stored_blocks_.clear();  // blocks the stored prompts hold that no running row holds
  for (int64_t i = 0; i < options_.prefix_rows; ++i)
    for (int64_t m = 0, row = options_.slots + i; m < kb.held(row); ++m)
      stored_blocks_.push_back(kb.at(row, m));
  std::sort(stored_blocks_.begin(), stored_blocks_.end());
  stored_blocks_.erase(std::unique(stored_blocks_.begin(), stored_blocks_.end()),
                       stored_blocks_.end());
  for (size_t r = 0; r < rows_.size(); ++r)
    for (int64_t m = 0; m < kb.held(int64_t(r)); ++m) {
      auto it =
          std::lower_bound(stored_blocks_.begin(), stored_blocks_.end(), kb.at(int64_t(r), m));
      if (it != stored_blocks_.end() && *it == kb.at(int64_t(r), m)) stored_blocks_.erase(it);
    }
  kv_blocks_stored_ = int64_t(stored_blocks_.size());
  kv_blocks_free_ = kb.free_blocks();
}

void Batcher::make_room(int64_t blocks) {
  while (cache_.blocks()->free_blocks() < blocks) {
    int64_t lru = -1;
    for (int64_t i = 0; i < options_.prefix_rows; ++i)
      if (!prefix_tokens_[size_t(i)].empty() &&
          (lru < 0 || prefix_used_[size_t(i)] < prefix_used_[size_t(lru)]))
        lru = i;
    if (lru < 0) return;  // the reservations leave room for what the running rows need
    cache_.release_row(options_.slots + lru);
    prefix_tokens_[size_t(lru)].clear();
    prefix_used_[size_t(lru)] = 0;  // the first to be filled again
  }
}

void Batcher::admit() {
  // Prompt tokens this step may prefill: the running requests' next tokens
  // wait for at most this much (0: whole prompts, however long).
  int64_t budget =
      options_.prefill_chunk > 0 ? options_.prefill_chunk : std::numeric_limits<int64_t>::max();
  while (budget > 0 && (prefilling_ || start_prefill())) {
    Request& r = *prefilling_;
    const auto L = int64_t(r.prompt.size());
    bool joined = false;
    try {
      if (r.cancelled) {
        finish(r, Finish::cancelled);
      } else {
        const int64_t n = std::min(budget, L - r.prefilled);
        budget -= n;
        Tensor logits = prefill_part(r, n);  // [1, V]
        if (r.prefilled < L) return;         // the rest at the next step
        joined = join(r, logits);
      }
    } catch (const std::exception& e) {
      cache_.release_row(int64_t(rows_.size()));  // join may have moved blocks there
      r.held = e.what();
      finish(r, Finish::error);
    }
    cache_.release_row(staging_row());
    if (joined) {
      rows_.push_back(std::move(prefilling_));
    } else {
      reserved_ -= r.reserve;
      prefilling_.reset();
    }
    running_ = int64_t(rows_.size());
  }
}

// The next waiting request for which a row is free and the pool can promise
// its blocks becomes the one prefilling: its prompt's longest held prefix
// in prefill_ and (shared) in the staging row.
bool Batcher::start_prefill() {
  while (int64_t(rows_.size()) < options_.slots) {
    if (waiting_.empty()) return false;
    // In order: the first waits until the blocks it may fill are free of
    // reservations (running requests end).
    if (!waiting_.front()->cancelled && reserved_ + waiting_.front()->reserve > kv_blocks_)
      return false;
    std::unique_ptr<Request> r = std::move(waiting_.front());
    waiting_.pop_front();
    if (r->cancelled) {
      finish(*r, Finish::cancelled);
      continue;
    }
    waiting_count_ = int64_t(waiting_.size());
    try {
      if (tokenizer_) {
        r->text.emplace(*tokenizer_, /*skip_special_tokens=*/true);
        for (int64_t t : r->prompt) r->text->step(int32_t(t));  // context for the first piece
      }
      for (int64_t t : r->prompt) r->hist.push(t, false);
      r->hist.prompt_length = int64_t(r->prompt.size());
      prefill_.reset();
      const Prefix pre = reuse_prefix(r->prompt);  // tokens [0, pre.tokens) are in prefill_
      if (pre.tokens > 0)
        cache_.copy_row(staging_row(), cache_, pre.row, pre.tokens);
      else
        cache_.release_row(staging_row());
      r->prefilled = pre.tokens;
      reused_tokens_ += pre.tokens;
    } catch (const std::exception& e) {
      cache_.release_row(staging_row());
      r->held = e.what();
      finish(*r, Finish::error);
      continue;
    }
    reserved_ += r->reserve;
    prefilling_ = std::move(r);
    running_ = int64_t(rows_.size()) + 1;
    return true;
  }
  return false;
}

// The prompt's next n tokens through the model in the one-row cache; the
// logits of the last of them [1, V].
Tensor Batcher::prefill_part(Request& r, int64_t n) {
  Tensor ids = Tensor::empty({1, n}, DType::i64);  // [1, n]
  std::copy_n(r.prompt.begin() + r.prefilled, n, ids.data<int64_t>());
  Tensor last = Tensor::full({1}, float(n - 1), DType::i64);  // [1]
  ctx_.cache = &prefill_;
  Tensor logits = detail::run_step(step_, ctx_, prefill_, ids, {n}, last);
  r.prefilled += n;
  prompt_tokens_ += n;
  return logits;
}

// The whole prompt prefilled: its keys and values into blocks (after the
// shared prefix the staging row holds), the staging row's blocks to the next
// free row, its first token drawn. False when that ended it.
bool Batcher::join(Request& r, Tensor logits) {
  const auto L = int64_t(r.prompt.size()), row = int64_t(rows_.size());
  const nn::KVBlocks& kb = *cache_.blocks();
  make_room(kb.blocks_for(L) - cache_.length(staging_row()) / kb.block_tokens());
  cache_.append_row(staging_row(), prefill_, 0, L);
  cache_.move_row(row, staging_row());
  remember_prompt(r.prompt, row);
  const int64_t tok = take_token(r, {logits.data<float>(), size_t(logits.dim(1))});
  if (r.ended) {
    cache_.release_row(row);
    return false;
  }
  next_.data<int64_t>()[row] = tok;
  return true;
}

Batcher::Prefix Batcher::reuse_prefix(const std::vector<int64_t>& prompt) {
  const auto L = int64_t(prompt.size());
  if (options_.prefix_rows == 0 || L - 1 < options_.min_prefix) return {};
  // The candidates: running rows (their cached tokens) and stored prompts.
  Prefix best;
  auto consider = [&](int64_t row, const std::vector<int64_t>& tokens) {
    const int64_t most = std::min({cache_.length(row), L - 1, int64_t(tokens.size())});
    int64_t n = 0;
    while (n < most && tokens[size_t(n)] == prompt[size_t(n)]) ++n;
    if (n > best.tokens) best = {row, n};
  };
  for (size_t i = 0; i < rows_.size(); ++i) consider(int64_t(i), rows_[i]->hist.tokens);
  for (size_t i = 0; i < prefix_tokens_.size(); ++i)
    consider(options_.slots + int64_t(i), prefix_tokens_[i]);
  if (best.tokens < options_.min_prefix) return {};
  prefill_.copy_row(0, cache_, best.row, best.tokens);
  if (best.row >= options_.slots) prefix_used_[size_t(best.row - options_.slots)] = ++clock_;
  return best;
}

// The prompt's blocks (in `row`) shared by the store, replacing the least
// recently used stored prompt, unless it is stored already.
void Batcher::remember_prompt(const std::vector<int64_t>& prompt, int64_t row) {
  if (options_.prefix_rows == 0 || int64_t(prompt.size()) <= options_.min_prefix) return;
  for (const auto& held : prefix_tokens_)
    if (held == prompt) return;
  const auto i =
      int64_t(std::min_element(prefix_used_.begin(), prefix_used_.end()) - prefix_used_.begin());
  cache_.copy_row(options_.slots + i, cache_, row, int64_t(prompt.size()));
  prefix_tokens_[size_t(i)] = prompt;
  prefix_used_[size_t(i)] = ++clock_;
}

void Batcher::decode() {
  const auto n = int64_t(rows_.size());
  cache_.set_rows(n);
  ctx_.cache = &cache_;
  try {
    std::vector<int64_t> one(size_t(n), 1);
    make_room(cache_.blocks_to_append(one));
    Tensor logits = detail::run_step(step_, ctx_, cache_, next_.slice0(0, n), std::move(one),
                                     Tensor());  // [n, V]
    const int64_t V = logits.dim(1);
    for (int64_t i = 0; i < n; ++i) {
      Request& r = *rows_[size_t(i)];
      const int64_t tok = take_token(r, {logits.data<float>() + i * V, size_t(V)});
      next_.data<int64_t>()[i] = tok;
    }
  } catch (const std::exception& e) {  // every running request ends with the step's error
    for (auto& r : rows_) {
      r->held = e.what();
      finish(*r, Finish::error);
    }
    cache_.reset();
    for (auto& tokens : prefix_tokens_) tokens.clear();
  }
  release_finished();
}

int64_t Batcher::take_token(Request& r, std::span<float> logits) {
  const GenerationConfig& c = r.config;
  apply_processors(logits, r.hist, c);
  float u = 0.f;
  if (c.do_sample)  // the draw generate makes for this prompt at this step
    philox_uniform(&u, 1, c.seed, r.stream, r.hist.generated(), 0.f, 1.f);
  const int64_t tok = sampler_.choose(logits, c, u);
  r.hist.push(tok, true);
  ++generated_tokens_;
  const bool stopped = emit(r, tok);
  const bool eos =
      std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), tok) != c.eos_token_ids.end();
  if (r.ended) return tok;  // on_token cancelled it
  if (eos || stopped)
    finish(r, Finish::stop);
  else if (r.hist.generated() >= c.max_new_tokens ||
           int64_t(r.hist.tokens.size()) >= options_.context)
    finish(r, Finish::length);
  return tok;
}

// Gives the token and the text it completes to on_token; true when that text
// holds a stop string (the text from it on is dropped).
bool Batcher::emit(Request& r, int64_t token) {
  bool stopped = false;
  std::string out;
  if (r.text) {
    r.held += r.text->step(int32_t(token));
    const std::vector<std::string>& stops = r.config.stop_strings;
    const size_t at = first_stop(r.held, stops);
    stopped = r.stop_matched = at != std::string::npos;
    const size_t give = stopped ? at : r.held.size() - stop_prefix_at_end(r.held, stops);
    out = r.held.substr(0, give);
    r.held.erase(0, stopped ? r.held.size() : give);
  }
  if (r.events.on_token && !r.muted) {
    bool go_on = false;
    try {  // a callback that throws cancels its request; the model's step goes on
      go_on = r.events.on_token(token, out);
    } catch (const std::exception&) {
    }
    if (!go_on && exchange_) {  // in lockstep: at the next step, on every rank
      r.muted = true;           // until then no event, whatever it draws
      cancel(r.id);
    } else if (!go_on) {
      finish(r, Finish::cancelled);
    }
  }
  return stopped;
}

void Batcher::finish(Request& r, Finish why) {
  if (r.ended) return;
  r.ended = true;
  std::string rest = std::move(r.held);
  // The decoder's held-back bytes, unless a stop string ended it (what
  // follows one is dropped) or the text is an error's message.
  if (r.text && why != Finish::error && !r.stop_matched) rest += r.text->flush();
  if (r.events.on_finish) r.events.on_finish(why, rest);
}

// Ended rows leave; the last running row takes each one's place.
void Batcher::release_finished() {
  for (auto i = int64_t(rows_.size()) - 1; i >= 0; --i) {
    if (!rows_[size_t(i)]->ended) continue;
    reserved_ -= rows_[size_t(i)]->reserve;
    const auto last = int64_t(rows_.size()) - 1;
    cache_.release_row(i);
    if (i != last) {
      cache_.move_row(i, last);
      next_.data<int64_t>()[i] = next_.data<int64_t>()[last];
      rows_[size_t(i)] = std::move(rows_[size_t(last)]);
    }
    rows_.pop_back();
  }
  running_ = int64_t(rows_.size()) + (prefilling_ ? 1 : 0);
}

// ---- lockstep (tensor parallelism) ------------------------------------------

template <class Archive>
void serialize(Archive& a, GenerationConfig& c) {
  a(c.max_new_tokens, c.min_new_tokens, c.eos_token_ids, c.pad_token_id, c.forced_bos_token_id,
    c.forced_eos_token_id, c.decoder_start_token_id, c.stop_strings, c.do_sample, c.temperature,
    c.top_k, c.top_p, c.min_p, c.repetition_penalty, c.presence_penalty, c.frequency_penalty,
    c.no_repeat_ngram_size, c.num_beams, c.length_penalty, c.early_stopping, c.num_return_sequences,
    c.seed, c.cache_dtype);
}

void Batcher::lockstep(Exchange exchange, bool leader) {
  exchange_ = std::move(exchange);
  leader_ = leader;
}

void Batcher::release_followers() {
  if (!exchange_ || !leader_) return;
  std::vector<std::unique_ptr<Request>> none;
  std::vector<int64_t> no_cancels;
  share_step(none, no_cancels, true);
}

// The leader's arrivals and cancellations, as bytes through exchange_ to the
// followers, who take them as theirs (requests without events). False when
// the leader said stop.
bool Batcher::share_step(std::vector<std::unique_ptr<Request>>& arrived,
                         std::vector<int64_t>& cancels, bool stop) {
  std::string bytes;
  if (leader_) {
    std::ostringstream os;
    {
      cereal::BinaryOutputArchive ar(os);
      ar(stop, cancels, uint64_t(arrived.size()));
      for (auto& r : arrived) ar(r->id, r->prompt, r->config);
    }
    bytes = os.str();
  }
  exchange_(bytes);
  if (leader_) return !stop;
  std::istringstream is(bytes);
  cereal::BinaryInputArchive ar(is);
  uint64_t n = 0;
  ar(stop, cancels, n);
  for (uint64_t i = 0; i < n; ++i) {
    int64_t id = 0;
    std::vector<int64_t> prompt;
    GenerationConfig config;
    ar(id, prompt, config);
    auto r = make_request(std::move(prompt), std::move(config), {});
    r->id = id;
    arrived.push_back(std::move(r));
  }
  stopped_ = stop;
  return !stop;
}

}  // namespace redco::generation
