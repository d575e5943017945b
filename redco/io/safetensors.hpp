#pragma once
// Reading and writing the safetensors format
// (https://huggingface.co/docs/safetensors), byte-compatible with the
// reference implementation, so Python's `safetensors` package and numpy read
// redco's files with no redco installed, and redco reads theirs:
//
//   8 bytes   N, the header size, unsigned little-endian
//   N bytes   JSON: {"__metadata__": {str: str},
//                    "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...}
//             padded with spaces to a multiple of 8
//   the rest  the data buffer; [b, e) is relative to its start
//
// Like the reference writer, tensors are laid out by decreasing element size,
// then by name, so every tensor starts aligned to its element size. redco
// reads and writes F32, BF16, F16, I32, I64 and U8.
//
// Loading checks the whole header before reading any data: the header size
// against the file size, valid UTF-8 JSON with no duplicate names, known
// dtypes, shapes whose byte size matches the offsets, offsets inside the
// file, and a buffer covered exactly once (no gaps, no overlaps, no trailing
// bytes). Every failure is one redco::Error naming the file and, where one is
// at fault, the tensor.
//
// Data is read with plain reads into allocator buffers rather than mmap:
// loaded tensors are ordinary tensors (writable, freed to the cache, no
// mapping pinned for their lifetime), a file truncated or rewritten while in
// use is a read error instead of a SIGBUS, and for checkpoints the cost is
// disk bandwidth either way. load_safetensors_into reads straight into the
// destination tensors, with no intermediate copy.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "redco/core/param_tree.hpp"

namespace redco::io {

using Metadata = std::map<std::string, std::string>;

// Writes through a temporary file in the same folder (fsynced, then renamed
// over `path`), so readers see the old file or the new one, never a mix.
// Tensors must be CPU tensors; "__metadata__" is not a valid tensor name.
void save_safetensors(const std::filesystem::path& path, const ParamTree& tensors,
                      const Metadata& metadata = {});

// Every tensor in the file, under its name. `metadata`, if given, receives
// the file's __metadata__ (empty if it has none).
ParamTree load_safetensors(const std::filesystem::path& path, Metadata* metadata = nullptr);

// Fills existing tensors in place: the file must hold exactly the names of
// `tensors`, each with the same shape and dtype. Everything is checked before
// anything is written, so a mismatched file leaves `tensors` untouched.
void load_safetensors_into(const std::filesystem::path& path, ParamTree& tensors,
                           Metadata* metadata = nullptr);

// One tensor as a header describes it, before any data.
struct TensorSpec {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
};

// A safetensors file written by several processes at once, each pwrite()-ing
// the tensors it holds: every writer computes the same header (and so the
// same offsets) from the same specs. The creator makes the file, writes the
// header and sizes it; the others open it only after the creator's
// constructor has returned (behind a barrier). close() fsyncs. The caller
// publishes the file (checkpoints write into a temporary folder that one
// process renames once every writer has closed).
class SharedSafetensorsFile {
 public:
  SharedSafetensorsFile(std::filesystem::path path, std::vector<TensorSpec> specs, bool creator,
                        const Metadata& metadata = {});
  ~SharedSafetensorsFile();
  SharedSafetensorsFile(const SharedSafetensorsFile&) = delete;
  SharedSafetensorsFile& operator=(const SharedSafetensorsFile&) = delete;
  // `t` must match its spec's dtype and shape.
  void write(const std::string& name, const Tensor& t);
  void close();

 private:
  struct Slot {
    TensorSpec spec;
    uint64_t offset;  // of the tensor's first byte in the file
  };
  std::filesystem::path path_;
  std::map<std::string, Slot> slots_;
  int fd_ = -1;
};

// Reads the tensors of a safetensors file one at a time (bounded memory),
// after checking the whole header as load_safetensors does.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::filesystem::path path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;
  std::vector<TensorSpec> specs() const;  // in data order
  bool contains(std::string_view name) const;
  Tensor read(std::string_view name) const;  // throws naming the file if absent
  // Rows [row_begin, row_end) and columns [col_begin, col_end) of a 1-D or
  // 2-D tensor (a 1-D tensor is one column), in the file's dtype: reads only
  // those bytes (one read per row when the columns are a part of each row),
  // so a model shard is loaded without its whole tensor passing through memory.
  Tensor read_block(std::string_view name, int64_t row_begin, int64_t row_end, int64_t col_begin,
                    int64_t col_end) const;
  const std::filesystem::path& path() const { return path_; }

 private:
  struct Impl;
  std::filesystem::path path_;
  std::unique_ptr<Impl> impl_;
};

// The format's name for a dtype ("F32", "BF16", ...).
const char* safetensors_dtype(DType dtype);

// A file written through a temporary sibling "<name>.tmp-<6 random characters>": commit()
// fsyncs it, renames it over the target and fsyncs the folder; destroying an
// uncommitted AtomicFile deletes the temporary. Errors name the target.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path target);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();
  void write(const void* data, size_t size);
  void commit();

 private:
  std::filesystem::path target_, tmp_;
  int fd_ = -1;
};

// fsync on a folder, which makes renames and creations in it durable.
void fsync_directory(const std::filesystem::path& dir);

}  // namespace redco::io
