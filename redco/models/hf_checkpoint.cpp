// Hugging Face checkpoint folders: config.json, safetensors weights (single
// or sharded with an index), loaded slice by slice and saved in HF layout.
#include "redco/models/hf_checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "redco/autodiff/functional.hpp"
#include "redco/core/error.hpp"
#include "redco/io/safetensors.hpp"
#include "redco/ops/cpu/decode_panels.hpp"
#include "redco/ops/cpu/quantized_rows.hpp"

namespace redco::models::hf {
namespace fs = std::filesystem;

// ---- the weight files -----------------------------------------------------------------------

namespace {

// Every tensor of the checkpoint: its name -> the reader of the file that holds it.
struct WeightFiles {
  std::vector<std::unique_ptr<io::SafetensorsReader>> readers;
  std::map<std::string, const io::SafetensorsReader*, std::less<>> where;
  std::map<std::string, io::TensorSpec, std::less<>> specs;
};

WeightFiles open_weights(const fs::path& dir) {
  WeightFiles w;
  auto add_file = [&](const fs::path& file) {
    w.readers.push_back(std::make_unique<io::SafetensorsReader>(file));
    for (const io::TensorSpec& s : w.readers.back()->specs()) {
      REDCO_CHECK(!w.where.count(s.name), "tensor '{}' is in two weight files of '{}' ({} and {})",
                  s.name, dir.string(), w.where[s.name]->path().string(), file.string());
      w.where[s.name] = w.readers.back().get();
      w.specs[s.name] = s;
    }
  };
  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  if (fs::exists(single)) {
    add_file(single);
    return w;
  }
  if (!fs::exists(index)) {
    const bool bin =
        fs::exists(dir / "pytorch_model.bin") || fs::exists(dir / "pytorch_model.bin.index.json");
    throw Error(fmt::format("'{}' holds no model.safetensors or model.safetensors.index.json{}",
                            dir.string(),
                            bin ? ": it has PyTorch .bin weights; convert them with transformers "
                                  "(model.save_pretrained(dir, safe_serialization=True))"
                                : ""));
  }
  const auto by_file = parse_index(read_text(index, "index file"), index.string());
  for (const auto& [file, names] : by_file) {
    REDCO_CHECK(fs::exists(dir / file), "{} names weight file '{}', which is missing from '{}'",
                index.string(), file, dir.string());
    add_file(dir / file);
    for (const std::string& n : names)
      REDCO_CHECK(w.where.count(n) && w.where[n]->path() == dir / file,
                  "{} places tensor '{}' in '{}', but that file does not hold it", index.string(),
                  n, file);
  }
  return w;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string pick_prefix(const WeightFiles& w, const Layout& layout, const fs::path& dir) {
  REDCO_CHECK(!layout.sources.empty(), "load_weights: the layout lists no tensors");
  for (const std::string& p : layout.prefixes)
    if (w.where.count(p + layout.sources.front().hf)) return p;
  throw Error(fmt::format(
      "'{}': tensor '{}' is missing from the weights (looked for it with prefixes '{}'): the "
      "checkpoint does not match config.json, or is not a model of this family",
      dir.string(), layout.sources.front().hf, fmt::join(layout.prefixes, "', '")));
}

// Checks names, shapes and dtypes of the whole checkpoint before any data is read.
void check_checkpoint(const WeightFiles& w, const Layout& layout, const std::string& prefix,
                      const fs::path& dir) {
  std::set<std::string, std::less<>> expected;
  for (const TensorSource& s : layout.sources) {
    const std::string name = prefix + s.hf;
    expected.insert(name);
    auto it = w.specs.find(name);
    REDCO_CHECK(it != w.specs.end(),
                "'{}': tensor '{}' is missing from the weights (config.json implies it)",
                dir.string(), name);
    const io::TensorSpec& spec = it->second;
    REDCO_CHECK(spec.shape == s.hf_shape,
                "'{}': tensor '{}' in {} has shape {} but config.json implies {}", dir.string(),
                name, w.where.at(name)->path().string(), spec.shape, s.hf_shape);
    REDCO_CHECK(is_floating(spec.dtype),
                "'{}': tensor '{}' is stored as {}; redco loads F32, BF16 and F16 weights",
                dir.string(), name, io::safetensors_dtype(spec.dtype));
  }
  for (const auto& [name, spec] : w.specs) {
    if (expected.count(name)) continue;
    const bool ignored = std::any_of(layout.ignored_suffixes.begin(), layout.ignored_suffixes.end(),
                                     [&](const std::string& s) { return ends_with(name, s); });
    REDCO_CHECK(ignored,
                "'{}': unexpected tensor '{}' in {}: the weights hold more than config.json "
                "describes (another variant of the architecture?)",
                dir.string(), name, w.where.at(name)->path().string());
  }
}

// out[i, :] = in[rows[i], :] for f32 rows of `cols` elements.
Tensor gather_rows(const Tensor& in, const std::vector<int64_t>& rows, int64_t cols) {
  Tensor out = Tensor::empty(cols == 0 || in.rank() == 1 ? Shape{int64_t(rows.size())}
                                                         : Shape{int64_t(rows.size()), cols});
  const float* src = in.data<float>();
  float* dst = out.data<float>();
  const int64_t width = in.rank() == 1 ? 1 : cols;
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(dst + int64_t(i) * width, src + rows[i] * width, size_t(width) * sizeof(float));
  return out;
}

Tensor transpose2d(const Tensor& in) {  // f32 [r, c] -> [c, r]
  const int64_t r = in.dim(0), c = in.dim(1);
  Tensor out = Tensor::empty(Shape{c, r});
  const float* src = in.data<float>();
  float* dst = out.data<float>();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) dst[j * r + i] = src[i * c + j];
  return out;
}

// Rows [lo, hi) and columns [c0, c1) of the source tensor in its logical
// (untransposed) layout, as f32 [hi - lo, c1 - c0] (or [hi - lo] for a vector).
Tensor read_rows(const io::SafetensorsReader& file, const std::string& name, const TensorSource& s,
                 int64_t lo, int64_t hi, int64_t c0, int64_t c1) {
  if (!s.transposed) return file.read_block(name, lo, hi, c0, c1).to(DType::f32);
  return transpose2d(file.read_block(name, c0, c1, lo, hi).to(DType::f32));
}

// This rank's slice of one parameter: its rows `prow` (positions in the
// parameter) and columns [c0, c1), read from the source tensor. Only the rows
// it needs are read, one block per contiguous run of them: a parameter taken
// from a fused tensor head by head (GPT-NeoX's query_key_value) reads its
// heads' rows, not the span between its first and last.
Tensor read_slice(const io::SafetensorsReader& file, const std::string& name, const TensorSource& s,
                  const std::vector<int64_t>& prow, int64_t c0, int64_t c1) {
  std::vector<int64_t> src(prow.size());
  for (size_t i = 0; i < prow.size(); ++i) src[i] = s.rows.empty() ? prow[i] : s.rows[prow[i]];
  if (src.empty()) return Tensor::empty(s.hf_shape.rank() == 1 ? Shape{0} : Shape{0, c1 - c0});
  std::vector<int64_t> need = src;  // the distinct source rows, ascending
  std::sort(need.begin(), need.end());
  need.erase(std::unique(need.begin(), need.end()), need.end());
  TensorList runs;
  for (size_t a = 0; a < need.size();) {
    size_t b = a + 1;
    while (b < need.size() && need[b] == need[b - 1] + 1) ++b;
    runs.push_back(read_rows(file, name, s, need[a], need[b - 1] + 1, c0, c1));
    a = b;
  }
  Tensor block = runs.size() == 1 ? runs[0] : concat(runs, 0);  // the rows of `need`
  if (src == need) return block;
  for (int64_t& r : src) r = std::lower_bound(need.begin(), need.end(), r) - need.begin();
  return gather_rows(block, src, c1 - c0);
}

// Whether the plan makes p a layer's [out, in] weight (or a vocabulary
// table, which is the LM head's weight or gathered by rows): the matrices a
// decode step multiplies, and no others (positions are sliced, T5's bias
// table is read by heads).
bool multiplied_by_rows(const shard::ParamSplit& p) {
  using shard::Role;
  // A [vocab, 1] column is a bias added to the logits (BART's final_logits_bias).
  if (p.shape.rank() != 2 || p.shape[1] == 1) return false;
  switch (p.role) {
    case Role::column:
    case Role::row:
    case Role::attn_q:
    case Role::attn_k:
    case Role::attn_v:
    case Role::attn_o:
    case Role::vocab:
      return true;
    default:
      return false;
  }
}

// A parameter in the dtype asked for. i8: matrices quantized by rows
// (weight-only int8), vectors (norms, biases) and other ranks kept in f32.
// bf16 or i8 with decode_panels: the multiplied matrices packed for decoding (pack_panels,
// pack_panels_i8), the rest plain bf16 / as above.
Tensor converted(const Tensor& t, const shard::ParamSplit& split, const LoadOptions& opts) {
  if (opts.dtype == DType::f32) return t;
  if (opts.dtype == DType::bf16 && opts.decode_panels && multiplied_by_rows(split))
    return pack_panels(t);
  if (opts.dtype != DType::i8) return t.to(opts.dtype);
  if (opts.decode_panels && multiplied_by_rows(split)) return pack_panels_i8(t);
  return t.rank() == 2 ? quantize_rows(t) : t;
}

}  // namespace

nn::ParamTree load_weights(const fs::path& dir, const Layout& layout,
                           const std::vector<shard::ParamSplit>& plan, const LoadOptions& opts) {
  REDCO_CHECK(opts.n_shards >= 1 && opts.rank >= 0 && opts.rank < opts.n_shards,
              "load_weights: rank {} is not a shard of {}", opts.rank, opts.n_shards);
  REDCO_CHECK(is_floating(opts.dtype) || opts.dtype == DType::i8,
              "load_weights: parameters must be f32, bf16, f16 or i8 (int8 matrices for "
              "inference), not {}",
              dtype_name(opts.dtype));
  const WeightFiles w = open_weights(dir);
  const std::string prefix = pick_prefix(w, layout, dir);
  check_checkpoint(w, layout, prefix, dir);
  std::map<std::string_view, const TensorSource*> by_param;
  for (const TensorSource& s : layout.sources) by_param[s.param] = &s;

  nn::ParamTree out;
  for (const shard::ParamSplit& split : plan) {
    auto it = by_param.find(split.name);
    REDCO_CHECK(it != by_param.end(), "load_weights: the layout has no source for parameter '{}'",
                split.name);
    const TensorSource& s = *it->second;
    const std::string name = prefix + s.hf;
    const Shape& shape = split.shape;  // the whole parameter
    Tensor t;
    if (shape.rank() > 2) {  // convolutions and the like: whole, as stored
      REDCO_CHECK(!s.transposed && s.rows.empty() && split.split_dim < 0,
                  "load_weights: '{}' (rank {}) can only be read whole", split.name, shape.rank());
      t = w.where.at(name)->read(name).to(DType::f32);
    } else {
      const int64_t rows = shape[0], cols = shape.rank() == 2 ? shape[1] : 1;
      std::vector<int64_t> prow;
      int64_t c0 = 0, c1 = cols;
      const bool split_here = opts.n_shards > 1 && split.split_dim >= 0;
      const shard::IndexRange range = split_here
                                          ? shard::shard_range(split, opts.n_shards, opts.rank)
                                          : shard::IndexRange{0, rows};
      if (split_here && split.split_dim == 1) {  // this shard's columns of every row
        c0 = range.begin, c1 = range.end;
        for (int64_t r = 0; r < rows; ++r) prow.push_back(r);
      } else {
        for (int64_t i = range.begin; i < range.end; ++i) prow.push_back(i);
      }
      t = read_slice(*w.where.at(name), name, s, prow, c0, c1);
    }
    out.emplace(split.name, converted(t, split, opts));
  }
  return out;
}

// ---- saving ---------------------------------------------------------------------------------

namespace {

// One checkpoint tensor (stored layout, f32) assembled from its parameters.
Tensor assemble(const std::vector<const TensorSource*>& parts, const nn::ParamTree& params) {
  const TensorSource& first = *parts.front();
  const Shape stored = first.hf_shape;
  const Shape logical = first.transposed ? Shape{stored[1], stored[0]} : stored;
  const int64_t rows = logical[0], width = logical.numel() / std::max<int64_t>(rows, 1);
  Tensor out = Tensor::zeros(logical);
  float* dst = out.data<float>();
  int64_t covered = 0;
  for (const TensorSource* s : parts) {
    auto it = params.find(s->param);
    REDCO_CHECK(it != params.end(), "save_pretrained: parameter '{}' is missing", s->param);
    const Tensor p = it->second.to(Device::cpu()).to(DType::f32);
    const int64_t n = s->rows.empty() ? rows : int64_t(s->rows.size());
    REDCO_CHECK(p.numel() == n * width,
                "save_pretrained: parameter '{}' has shape {}, which does not fill {} rows of "
                "'{}' (shape {})",
                s->param, p.shape(), n, s->hf, logical);
    const float* src = p.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = s->rows.empty() ? i : s->rows[size_t(i)];
      std::memcpy(dst + r * width, src + i * width, size_t(width) * sizeof(float));
    }
    covered += n;
  }
  REDCO_CHECK(covered == rows, "save_pretrained: the parameters fill {} of the {} rows of '{}'",
              covered, rows, first.hf);
  return first.transposed ? transpose2d(out) : out;
}

void write_text(const fs::path& path, const std::string& text) {
  io::AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

}  // namespace

void save_folder(const fs::path& dir, const io::Json& config, const Layout& layout,
                 const nn::ParamTree& params, const SaveOptions& opts) {
  REDCO_CHECK(is_floating(opts.dtype), "save_pretrained: the dtype must be f32, bf16 or f16");
  REDCO_CHECK(opts.max_shard_bytes > 0, "save_pretrained: max_shard_bytes must be positive");
  std::error_code ec;
  fs::create_directories(dir, ec);
  REDCO_CHECK(!ec, "save_pretrained: cannot create '{}': {}", dir.string(), ec.message());
  // Checkpoint tensors in first-appearance order, each with the parameters it holds.
  std::vector<std::pair<std::string, std::vector<const TensorSource*>>> tensors;
  std::map<std::string, size_t> index_of;
  for (const TensorSource& s : layout.sources) {
    auto [it, fresh] = index_of.emplace(s.hf, tensors.size());
    if (fresh) tensors.push_back({s.hf, {}});
    tensors[it->second].second.push_back(&s);
  }
  // Files of at most max_shard_bytes (a tensor larger than that gets a file of its own).
  std::vector<nn::ParamTree> files(1);
  int64_t bytes = 0, total = 0;
  const std::string prefix = layout.prefixes.front();
  for (const auto& [hf, parts] : tensors) {
    Tensor t = assemble(parts, params);
    if (opts.dtype != DType::f32) t = t.to(opts.dtype);
    const int64_t b = t.numel() * int64_t(dtype_size(t.dtype()));
    if (bytes > 0 && bytes + b > opts.max_shard_bytes) files.emplace_back(), bytes = 0;
    files.back().emplace(prefix + hf, std::move(t));
    bytes += b, total += b;
  }
  // Weight files an earlier save left here would shadow or contradict the new ones.
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("model", 0) == 0 &&
        (ends_with(n, ".safetensors") || n == "model.safetensors.index.json"))
      fs::remove(e.path());
  }
  const io::Metadata meta{{"format", "pt"}};  // transformers requires it
  if (files.size() == 1) {
    io::save_safetensors(dir / "model.safetensors", files[0], meta);
  } else {
    io::Json weight_map = io::Json::object();
    for (size_t i = 0; i < files.size(); ++i) {
      const std::string name =
          fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, files.size());
      io::save_safetensors(dir / name, files[i], meta);
      for (const auto& [tensor, t] : files[i]) weight_map[tensor] = name;
    }
    io::Json index = io::Json::object();
    index["metadata"]["total_size"] = total;
    index["weight_map"] = std::move(weight_map);
    write_text(dir / "model.safetensors.index.json", index.dump(true) + "\n");
  }
  write_text(dir / "config.json", config.dump(true) + "\n");
  io::fsync_directory(dir);
}

}  // namespace redco::models::hf
