#pragma once
// Hugging Face checkpoint folders in and out: config.json plus weights in
// model.safetensors or a sharded model.safetensors.index.json, under the
// names `transformers` uses.
//
// A model family describes its checkpoint as a list of TensorSource: for each
// redco parameter, the checkpoint tensor it comes from, whether that tensor is
// stored transposed ([in, out], GPT-2's Conv1D) and which of its rows the
// parameter takes (a fused q|k|v tensor gives three parameters; a rotary
// permutation reorders rows). That one list drives both directions, so a
// save followed by a load is the identity by construction.
//
// Loading reads, for each parameter, only the slice this rank holds under the
// shard plan (io::SafetensorsReader::read_block): with n model shards a rank's
// peak memory is its shard plus one row block, never the whole model. Every
// check (files present, every expected tensor there with its shape and a
// float dtype, no unexpected tensor) runs before any data is read, so a bad
// folder fails with one message and nothing half-loaded.
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "redco/io/json.hpp"
#include "redco/nn/walk.hpp"
#include "redco/shard/split.hpp"

namespace redco::models::hf {

struct TensorSource {
  std::string param;          // redco parameter name: "h.3.attn.q_proj.weight"
  std::string hf;             // checkpoint name without the model prefix: "h.3.attn.c_attn.weight"
  Shape hf_shape;             // as stored in the checkpoint
  bool transposed = false;    // stored [in, out]: the parameter reads its transpose
  std::vector<int64_t> rows;  // the parameter's rows as rows of the (transposed) tensor; empty: all
};

struct Layout {
  std::vector<TensorSource> sources;
  // Prefixes the checkpoint names may carry, tried in order when loading
  // ("transformer." for GPT2LMHeadModel, "" for GPT2Model); the first is
  // written when saving.
  std::vector<std::string> prefixes{""};
  // Checkpoint tensors that are not parameters (buffers such as a causal mask
  // or rotary frequencies): skipped on load. Matched as name suffixes.
  std::vector<std::string> ignored_suffixes;
};

// Sources for the common case: parameter p is checkpoint tensor `hf` as is.
TensorSource same(std::string param, std::string hf, Shape shape);

// A checkpoint folder's text file; the error names `what` and the path.
std::string read_text(const std::filesystem::path& path, std::string_view what);

// config.json, with typed getters whose errors name the file and the key.
class Config {
 public:
  explicit Config(const std::filesystem::path& dir);  // reads dir/config.json
  Config(io::Json json, std::string source) : json_(std::move(json)), source_(std::move(source)) {}
  const io::Json& json() const { return json_; }
  io::Json& json() { return json_; }
  const std::string& source() const { return source_; }
  bool has(std::string_view key) const;  // present and not null
  int64_t integer(std::string_view key) const;
  int64_t integer(std::string_view key, int64_t fallback) const;
  // A dimension or count: an integer in [1, 2^31), so that no size derived
  // from it divides by zero or overflows.
  int64_t size(std::string_view key) const;
  int64_t size(std::string_view key, int64_t fallback) const;  // when absent or null
  double number(std::string_view key) const;
  double number(std::string_view key, double fallback) const;
  bool boolean(std::string_view key, bool fallback) const;
  std::string string(std::string_view key) const;
  std::string string(std::string_view key, std::string fallback) const;
  const io::Json& object(std::string_view key) const;  // an object member (throws if absent)
  std::string model_type() const;                      // "model_type", required
  // Throws unless model_type is one of `accepted`, naming what the folder holds.
  void expect_model_type(std::initializer_list<std::string_view> accepted,
                         std::string_view loader) const;
  [[noreturn]] void fail(std::string_view key, std::string_view problem) const;

 private:
  const io::Json* find(std::string_view key) const;
  io::Json json_;
  std::string source_;
};

// model.safetensors.index.json's weight_map grouped by file: file -> the
// tensors it holds. Throws naming `source` for malformed JSON, a missing
// weight_map, or a file entry that is not a plain file name in the folder.
std::map<std::string, std::vector<std::string>> parse_index(std::string_view text,
                                                            const std::string& source);

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct LoadOptions {
  // Parameters are converted to it: f32, bf16 or f16; or i8, weight-only int8
  // for inference (matrices quantized by rows, quantize_rows; the rest f32).
  DType dtype = DType::f32;
  int n_shards = 1;  // model shards: this rank reads only its slice of each tensor
  int rank = 0;      // which shard
  // bf16 or i8, for decoding on the CPU: matrices packed in decode panels
  // (pack_panels, pack_panels_i8), which a decode step at a batch of several
  // sequences reads at up to 1.7x the rate of row-major bf16, and int8 at
  // batch 1 at 1.3x the rate of row-major int8 (AVX-512; ask
  // cpu::panels_pay()). Inference only: the weights are not trainable then.
  bool decode_panels = false;
};

// Reads the parameters of `layout` from dir's safetensors file(s). `plan`
// (shard::resolve of the model for opts.n_shards) lists every parameter with
// its split, in the model's order; the result holds this rank's slices.
nn::ParamTree load_weights(const std::filesystem::path& dir, const Layout& layout,
                           const std::vector<shard::ParamSplit>& plan, const LoadOptions& opts);

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct SaveOptions {
  DType dtype = DType::f32;                 // on-disk dtype of floating tensors
  int64_t max_shard_bytes = 5'000'000'000;  // above it: model-0000k-of-0000n + index
};

// Writes config.json and the weights (whole parameters) under the checkpoint
// names of `layout` with its first prefix; fused tensors are reassembled.
// Files go through temporaries renamed into place.
void save_folder(const std::filesystem::path& dir, const io::Json& config, const Layout& layout,
                 const nn::ParamTree& params, const SaveOptions& opts);

}  // namespace redco::models::hf
