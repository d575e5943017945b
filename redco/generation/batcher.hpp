#pragma once
// Continuous batching: requests join and leave the running batch at every
// decode step, each with its own sampling, stop strings and length, as a
// server needs (tools/redco-serve).
//
//   generation::Batcher batcher(step, {.slots = 8, .context = 2048}, &tokenizer);
//   batcher.submit(prompt_ids, {.max_new_tokens = 64, .eos_token_ids = {2}},
//                  {.on_token = [](int64_t id, std::string_view text) { ...; return true; },
//                   .on_finish = [](Finish why, std::string_view rest) { ... }});
//   while (running) { batcher.wait_for_work(); batcher.step(); }  // one thread
//
// How: one paged KV cache (KVCache::Paging: a pool of blocks of kv_block
// tokens) holds every running request, the rows in use at the front
// (KVCache::set_rows), so a decode step runs exactly the requests that are
// running: ids [running, 1]. A request joining is prefilled alone in a
// one-row cache (its prompt is a GEMM of its own; batching prompts of
// different lengths would pad every row to the longest), its first token
// drawn from that, and its keys and values copied into blocks of the next
// free row; a request that ends gives its blocks back and its row to the last
// running one (the block table's row moves; no key is copied). No step
// allocates.
//
// Memory follows the tokens: a request reserves the blocks its prompt and
// max_new_tokens can fill (at most the context) when it joins, and waits in
// the queue while the pool cannot promise them, so a running request never
// runs out. A prompt prefix another request or the prefix store holds is
// shared block for block, not copied (a block is copied only when a row
// writes into one it shares).
//
// A joining prompt is prefilled prefill_chunk tokens a step at most (chunked
// prefill), between the running requests' decode steps.
//
// A request gets the tokens generation::generate gives its prompt alone:
// greedy, and sampling too (the draws are keyed by the seed, the prompt and
// the step, not by the batch).
//
// submit, cancel and the counters are safe from any thread; step and
// wait_for_work belong to one thread (the one that runs the model).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "redco/data/tokenizer.hpp"
#include "redco/generation/generate.hpp"
#include "redco/generation/logits_process.hpp"
#include "redco/nn/kv_cache.hpp"

namespace redco::generation {

struct BatcherOptions {
  int64_t slots = 8;       // requests decoded together (the KV cache's rows)
  int64_t context = 2048;  // tokens a request may hold: prompt + new tokens
  int64_t max_queue = 64;  // requests waiting for a row (none free); submit refuses more
  int64_t vocab_size = 0;  // > 0: prompt ids and eos ids are checked against it
  std::optional<DType> cache_dtype{};  // as GenerationConfig::cache_dtype
  // Prompt prefixes reused: a joining request whose prompt begins with at
  // least min_prefix tokens a running request or one of the last prefix_rows
  // prompts holds shares their blocks and prefills only the rest (a chat's
  // system prompt, few-shot examples). 0 rows: off. The stored prompts hold
  // blocks no request reserved: the least recently used gives them back when
  // a request needs them.
  int64_t prefix_rows = 4;
  int64_t min_prefix = 16;
  // The KV cache: blocks of kv_block tokens, kv_tokens in all (rounded up to
  // whole blocks; 0: (slots + prefix_rows) x context in whole blocks per row,
  // every row able to fill the context and as much again for each stored
  // prompt).
  int64_t kv_block = 64;
  int64_t kv_tokens = 0;
  // Chunked prefill: a step prefills at most this many prompt tokens (of one
  // request or several), so a long prompt is prefilled over several steps,
  // each followed by a decode step of the running requests, instead of
  // stalling them for its whole length. 0: whole prompts.
  int64_t prefill_chunk = 512;
};

enum class Finish {
  stop,       // an end-of-sequence id or a stop string
  length,     // max_new_tokens, or the context is full
  cancelled,  // cancel(), or on_token returned false
  error,      // the model failed: on_finish's text is the error's message
};
std::string_view finish_name(Finish f);  // "stop", "length", "cancelled"

struct RequestEvents {
  // Each new token and the text it completes (whole UTF-8 characters, maybe
  // none; text that may begin a stop string is held back until it cannot).
  // Return false to cancel the request. Called on the stepping thread.
  std::function<bool(int64_t token, std::string_view text)> on_token{};
  // Once, at the end: why, and the text held back until then. A stop
  // string and what follows it are not part of the text (OpenAI's "stop").
  std::function<void(Finish why, std::string_view text)> on_finish{};
};

class Batcher {
 public:
  // tokenizer: for the text in the events and stop strings (may be null:
  // ids only). ctx: what every step carries (mp under tensor parallelism).
  Batcher(StepFn step, BatcherOptions options, const data::Tokenizer* tokenizer = nullptr,
          nn::Ctx ctx = {});
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues a request; it joins at a step with a free row. Returns its id, or
  // nullopt when every row is taken and max_queue requests already wait for
  // one (a server's 429). A
  // request that cannot run (empty prompt, too long for the context, a
  // config out of range, beams) throws a redco::Error naming why.
  std::optional<int64_t> submit(std::vector<int64_t> prompt, GenerationConfig config,
                                RequestEvents events);
  // Ends a request at the next step (its on_finish says cancelled); a request
  // that ended already is left alone.
  void cancel(int64_t id);

  // Admits waiting requests into free rows (prefilling each), then decodes
  // one token for every running request. Returns false when there was
  // nothing to do.
  bool step();
  // Blocks until a request is waiting or running, or `timeout` passes, or
  // stop_waiting() is called.
  void wait_for_work(std::chrono::milliseconds timeout);
  void stop_waiting();

  // Tensor parallelism: the ranks of a model-parallel group each run a
  // Batcher over their shard of the model, in lockstep. The leader's (rank
  // 0's) requests and cancellations are the ones that run: at the start of
  // each step the leader hands them to `exchange` as bytes, which gives them
  // to every other rank (a broadcast: the followers' exchange fills `bytes`),
  // and each follower's step() then takes exactly those. With the same
  // requests at the same steps and the same logits (the model's output is
  // the same on every rank) every rank makes the same choices and draws the
  // same tokens. A follower's requests have no events; its loop is
  //   while (!batcher.stopped()) batcher.step();
  // A request the leader's on_token cancels ends at the next step, on every rank.
  using Exchange = std::function<void(std::string& bytes)>;
  void lockstep(Exchange exchange, bool leader);
  // Leader: the followers' last step (stopped() turns true there). Call
  // once, after the leader's last step.
  void release_followers();
  bool stopped() const { return stopped_; }

  int64_t running() const { return running_.load(); }  // decoding, or prefilling to join
  int64_t queued() const;
  int64_t free_rows() const { return options_.slots - running(); }
  const BatcherOptions& options() const { return options_; }
  // Totals since construction.
  int64_t prompt_tokens() const { return prompt_tokens_.load(); }
  int64_t generated_tokens() const { return generated_tokens_.load(); }
  int64_t reused_tokens() const { return reused_tokens_.load(); }  // prompt tokens not prefilled
  // The KV cache's blocks: in the pool, free, and held by stored prompts
  // alone (not by a running request), as the last step left them.
  int64_t kv_blocks() const { return kv_blocks_; }
  int64_t kv_blocks_free() const { return kv_blocks_free_.load(); }
  int64_t kv_blocks_stored() const { return kv_blocks_stored_.load(); }

 private:
  struct Request;
  struct Prefix {
    int64_t row = 0, tokens = 0;  // cache_'s row holding the prompt's first tokens
  };
  // Prefills waiting requests, one at a time, prefill_chunk prompt tokens
  // in all; a request whose prompt is done joins the running rows.
  void admit();
  bool start_prefill();
  // A request's bookkeeping (its reserve checked against the pool).
  std::unique_ptr<Request> make_request(std::vector<int64_t> prompt, GenerationConfig config,
                                        RequestEvents events) const;
  bool share_step(std::vector<std::unique_ptr<Request>>& arrived, std::vector<int64_t>& cancels,
                  bool stop);
  Tensor prefill_part(Request& r, int64_t n);
  bool join(Request& r, Tensor logits);
  int64_t staging_row() const { return options_.slots + options_.prefix_rows; }
  // Puts the longest held prefix of `prompt` (at most its length - 1 tokens,
  // at least min_prefix) into prefill_'s row; tokens 0: none.
  Prefix reuse_prefix(const std::vector<int64_t>& prompt);
  // The prompt of running row `row` into the prefix store (its blocks shared).
  void remember_prompt(const std::vector<int64_t>& prompt, int64_t row);
  // Stored prompts give their blocks back, least recent first, until `blocks`
  // are free or none is left.
  void make_room(int64_t blocks);
  void count_blocks();
  void decode();
  // Draws r's next token from its logits [V] and gives it to r's events;
  // r.ended when that ended it (its on_finish called).
  int64_t take_token(Request& r, std::span<float> logits);
  bool emit(Request& r, int64_t token);
  void finish(Request& r, Finish why);
  void release_finished();

  StepFn step_;
  BatcherOptions options_;
  const data::Tokenizer* tokenizer_;
  nn::Ctx ctx_;
  // Paged, [slots + prefix_rows + 1 rows]: rows [0, running) in use, then
  // the stored prompts, then the staging row (the prefilling request's
  // shared prefix: its blocks until it joins).
  nn::KVCache cache_;
  nn::KVCache prefill_;                   // one row of slots: the prefilling request's prompt
  std::unique_ptr<Request> prefilling_;   // its prompt part way through the model
  int64_t kv_blocks_ = 0, reserved_ = 0;  // the pool's blocks; those running requests reserved
  // The stored prompts (cache_'s rows slots + i): their tokens and when each
  // was last used (the least recent is replaced).
  std::vector<std::vector<int64_t>> prefix_tokens_;
  std::vector<uint64_t> prefix_used_;
  std::vector<int64_t> stored_blocks_;  // count_blocks's scratch
  uint64_t clock_ = 0;
  Sampler sampler_;
  std::vector<std::unique_ptr<Request>> rows_;  // running requests, row r at rows_[r]
  Tensor next_;                                 // [slots, 1] i64: each row's next input

  mutable std::mutex mutex_;  // guards inbox_, cancelled_ids_, next_id_
  std::condition_variable work_;
  std::deque<std::unique_ptr<Request>> inbox_;    // submitted, not yet seen by a step
  std::deque<std::unique_ptr<Request>> waiting_;  // seen, waiting for a row (the stepping thread's)
  std::atomic<int64_t> waiting_count_{0};
  Exchange exchange_{};
  bool leader_ = true, stopped_ = false;
  std::vector<int64_t> cancelled_ids_;
  int64_t next_id_ = 0;
  bool stop_waiting_ = false;
  std::atomic<int64_t> running_{0}, prompt_tokens_{0}, generated_tokens_{0}, reused_tokens_{0};
  std::atomic<int64_t> kv_blocks_free_{0}, kv_blocks_stored_{0};
};

}  // namespace redco::generation
