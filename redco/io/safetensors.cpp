#include "redco/io/safetensors.hpp"

#include <fcntl.h>
#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "redco/core/heartbeat.hpp"

// rapidjson's member iterators predate C++20's reversed comparison operators;
// clang warns on every loop over them although the call is unambiguous.
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wambiguous-reversed-operator"
#endif

namespace redco::io {
namespace fs = std::filesystem;

// The format stores little-endian data; tensors are written and read as raw bytes.
static_assert(std::endian::native == std::endian::little,
              "redco's safetensors code assumes a little-endian host");

namespace {

// The reference implementation refuses larger headers; so do we, which also
// bounds what a corrupt size field can make us allocate.
constexpr uint64_t kMaxHeaderSize = 100'000'000;

template <typename... Args>
[[noreturn]] void bad(const fs::path& path, fmt::format_string<Args...> f, Args&&... args) {
  fail("safetensors file '{}': {}", path.string(), fmt::format(f, std::forward<Args>(args)...));
}

struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // relative to the data buffer
};

struct Header {
  std::vector<Entry> entries;  // in data order
  Metadata metadata;
  uint64_t data_start = 0;  // file offset of the data buffer: 8 + header size
};

struct DTypeName {
  DType dtype;
  const char* name;
  int rank;  // the reference writer's order: larger elements first
};
constexpr DTypeName kDTypes[] = {{DType::i64, "I64", 6}, {DType::f32, "F32", 5},
                                 {DType::i32, "I32", 4}, {DType::bf16, "BF16", 3},
                                 {DType::f16, "F16", 2}, {DType::u8, "U8", 1},
                                 {DType::i8, "I8", 1}};

const DTypeName& dtype_entry(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d;
  fail("dtype {} has no safetensors name", int(t));
}

uint64_t spec_bytes(const TensorSpec& t) {
  return uint64_t(t.shape.numel()) * uint64_t(dtype_size(t.dtype));
}

std::optional<DType> parse_dtype(std::string_view s) {
  for (const auto& d : kDTypes)
    if (s == d.name) return d.dtype;
  return std::nullopt;
}

std::string random_suffix() {
  static thread_local std::mt19937_64 rng{std::random_device{}() ^ uint64_t(::getpid()) << 32};
  return fmt::format("{:012x}", rng() & 0xffffffffffffull);
}

// An open file descriptor, closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Fd open_for_reading(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) bad(path, "cannot open: {}", std::strerror(errno));
  return Fd(fd);
}

void read_exact(int fd, void* dst, uint64_t size, uint64_t offset, const fs::path& path,
                std::string_view what) {
  auto* p = static_cast<char*>(dst);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, std::min<uint64_t>(size, 64ull << 20), off_t(offset));
    heartbeat::progress();  // a long read is progress, not a hang
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) bad(path, "reading {}: {}", what, std::strerror(errno));
    if (n == 0) bad(path, "reading {}: the file ends at byte {} (truncated?)", what, offset);
    p += n, size -= uint64_t(n), offset += uint64_t(n);
  }
}

std::string_view str(const rapidjson::Value& v) { return {v.GetString(), v.GetStringLength()}; }

Metadata parse_metadata(const rapidjson::Value& v, const fs::path& path) {
  if (!v.IsObject()) bad(path, "__metadata__ must be an object of strings");
  Metadata out;
  for (const auto& m : v.GetObject()) {
    const std::string key(str(m.name));
    if (!m.value.IsString()) bad(path, "__metadata__ value of '{}' is not a string", key);
    if (!out.emplace(key, str(m.value)).second) bad(path, "__metadata__ repeats the key '{}'", key);
  }
  return out;
}

// Reads a JSON array of non-negative integers (a shape or data_offsets).
std::vector<uint64_t> parse_uints(const rapidjson::Value* v, const char* field,
                                  const std::string& name, const fs::path& path) {
  if (!v) bad(path, "tensor '{}' has no {}", name, field);
  if (!v->IsArray()) bad(path, "tensor '{}': {} must be an array", name, field);
  std::vector<uint64_t> out;
  for (const auto& x : v->GetArray()) {
    if (!x.IsUint64()) bad(path, "tensor '{}': {} must hold non-negative integers", name, field);
    out.push_back(x.GetUint64());
  }
  return out;
}

Entry parse_entry(std::string name, const rapidjson::Value& v, const fs::path& path) {
  if (!v.IsObject()) bad(path, "tensor '{}': its header entry must be an object", name);
  const rapidjson::Value *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
  for (const auto& m : v.GetObject()) {
    const std::string_view key = str(m.name);
    const rapidjson::Value** slot = key == "dtype"          ? &dtype
                                    : key == "shape"        ? &shape
                                    : key == "data_offsets" ? &offsets
                                                            : nullptr;
    if (!slot) bad(path, "tensor '{}': unknown header field '{}'", name, key);
    if (*slot) bad(path, "tensor '{}': header field '{}' appears twice", name, key);
    *slot = &m.value;
  }
  Entry e;
  if (!dtype || !dtype->IsString()) bad(path, "tensor '{}': dtype must be a string", name);
  const auto dt = parse_dtype(str(*dtype));
  if (!dt)
    bad(path, "tensor '{}': dtype '{}' is not one redco reads (F32, BF16, F16, I32, I64, U8)", name,
        str(*dtype));
  e.dtype = *dt;
  const auto dims = parse_uints(shape, "shape", name, path);
  if (dims.size() > size_t(Shape::kMaxRank))
    bad(path, "tensor '{}' has rank {}; redco supports up to {}", name, dims.size(),
        Shape::kMaxRank);
  uint64_t bytes = dtype_size(e.dtype);
  std::vector<int64_t> sdims;
  for (uint64_t d : dims) {
    if (d > uint64_t(INT64_MAX) || __builtin_mul_overflow(bytes, d, &bytes))
      bad(path, "tensor '{}': shape is too large", name);
    sdims.push_back(int64_t(d));
  }
  e.shape = Shape(std::span<const int64_t>(sdims));
  const auto offs = parse_uints(offsets, "data_offsets", name, path);
  if (offs.size() != 2) bad(path, "tensor '{}': data_offsets must be [begin, end]", name);
  e.begin = offs[0], e.end = offs[1];
  if (e.end < e.begin || e.end - e.begin != bytes)
    bad(path, "tensor '{}': {}{} needs {} bytes but data_offsets [{}, {}] say {}", name,
        str(*dtype), e.shape, bytes, e.begin, e.end, int64_t(e.end - e.begin));
  e.name = std::move(name);
  return e;
}

// The buffer must be covered exactly once: every tensor inside it, no
// overlaps, no unclaimed bytes (which is also what the reference checks).
void check_layout(std::vector<Entry>& entries, uint64_t buffer_size, const fs::path& path) {
  for (const Entry& e : entries)
    if (e.end > buffer_size)
      bad(path,
          "tensor '{}': data_offsets [{}, {}] run past the {}-byte data buffer (truncated "
          "file or wrong header)",
          e.name, e.begin, e.end, buffer_size);
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  const Entry* last = nullptr;  // the tensor that ends at `pos`
  for (const Entry& e : entries) {
    if (e.begin < pos)
      bad(path, "tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", last->name, last->begin,
          last->end, e.name, e.begin, e.end);
    if (e.begin > pos) bad(path, "data bytes [{}, {}) belong to no tensor", pos, e.begin);
    if (e.end > e.begin) last = &e;
    pos = e.end;
  }
  if (pos != buffer_size)
    bad(path, "data bytes [{}, {}) after the last tensor belong to no tensor", pos, buffer_size);
}

Header parse_header(std::string_view text, uint64_t buffer_size, const fs::path& path) {
  if (text.empty() || text[0] != '{') bad(path, "the header does not start with '{{'");
  rapidjson::Document doc;
  constexpr unsigned kFlags =
      rapidjson::kParseValidateEncodingFlag | rapidjson::kParseIterativeFlag;
  doc.Parse<kFlags>(text.data(), text.size());
  if (doc.HasParseError())
    bad(path, "the header is not valid JSON: {} (at header byte {})",
        rapidjson::GetParseError_En(doc.GetParseError()), doc.GetErrorOffset());
  if (!doc.IsObject()) bad(path, "the header is not a JSON object");
  Header h;
  std::set<std::string, std::less<>> seen;
  for (const auto& m : doc.GetObject()) {
    std::string name(str(m.name));
    if (!seen.insert(name).second) bad(path, "the header names '{}' twice", name);
    if (name == "__metadata__") {
      h.metadata = parse_metadata(m.value, path);
    } else {
      h.entries.push_back(parse_entry(std::move(name), m.value, path));
    }
  }
  check_layout(h.entries, buffer_size, path);
  return h;
}

Header read_header(int fd, const fs::path& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) bad(path, "cannot stat: {}", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) bad(path, "not a regular file");
  const uint64_t file_size = uint64_t(st.st_size);
  if (file_size < 8)
    bad(path, "the file is {} bytes, too short for the 8-byte header size (truncated?)", file_size);
  unsigned char size_bytes[8];
  read_exact(fd, size_bytes, 8, 0, path, "the header size");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | size_bytes[i];
  if (n > file_size - 8)
    bad(path,
        "the header size field says {} bytes but the file has only {} after it "
        "(truncated, or not a safetensors file)",
        n, file_size - 8);
  if (n > kMaxHeaderSize)
    bad(path, "the header size {} exceeds the {}-byte limit", n, kMaxHeaderSize);
  std::string text(n, '\0');
  read_exact(fd, text.data(), n, 8, path, "the header");
  Header h = parse_header(text, file_size - 8 - n, path);
  h.data_start = 8 + n;
  return h;
}

using JsonWriter =
    rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>,
                      rapidjson::CrtAllocator, rapidjson::kWriteValidateEncodingFlag>;

void write_string(JsonWriter& w, const std::string& s, bool key, const fs::path& path) {
  const bool ok = key ? w.Key(s.data(), rapidjson::SizeType(s.size()))
                      : w.String(s.data(), rapidjson::SizeType(s.size()));
  if (!ok) bad(path, "'{}' is not valid UTF-8", s);
}

// The header text as the reference writer produces it: compact JSON,
// metadata first, then the tensors in data order, padded to 8 bytes.
std::string build_header(const std::vector<TensorSpec>& order, const Metadata& metadata,
                         const fs::path& path) {
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  w.StartObject();
  if (!metadata.empty()) {
    w.Key("__metadata__");
    w.StartObject();
    for (const auto& [k, v] : metadata) {
      write_string(w, k, true, path);
      write_string(w, v, false, path);
    }
    w.EndObject();
  }
  uint64_t offset = 0;
  for (const TensorSpec& t : order) {
    write_string(w, t.name, true, path);
    w.StartObject();
    w.Key("dtype");
    w.String(safetensors_dtype(t.dtype));
    w.Key("shape");
    w.StartArray();
    for (int64_t d : t.shape) w.Uint64(uint64_t(d));
    w.EndArray();
    w.Key("data_offsets");
    w.StartArray();
    w.Uint64(offset);
    w.Uint64(offset += spec_bytes(t));
    w.EndArray();
    w.EndObject();
  }
  w.EndObject();
  std::string text(buf.GetString(), buf.GetSize());
  text.resize((text.size() + 7) / 8 * 8, ' ');
  return text;
}

// The reference writer's data order: decreasing element size, then name.
void sort_specs(std::vector<TensorSpec>& specs, const fs::path& path) {
  std::set<std::string_view> seen;
  for (const TensorSpec& t : specs) {
    if (t.name == "__metadata__") bad(path, "'__metadata__' is reserved and cannot name a tensor");
    if (!seen.insert(t.name).second) bad(path, "tensor '{}' is listed twice", t.name);
  }
  std::stable_sort(specs.begin(), specs.end(), [](const TensorSpec& a, const TensorSpec& b) {
    const int ra = dtype_entry(a.dtype).rank, rb = dtype_entry(b.dtype).rank;
    return ra != rb ? ra > rb : a.name < b.name;
  });
}

// The 8-byte little-endian header size followed by the header text.
std::string header_bytes(const std::string& header) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(uint8_t(uint64_t(header.size()) >> (8 * i)));
  return out + header;
}

void write_exact(int fd, const void* src, uint64_t size, uint64_t offset, const fs::path& path) {
  const auto* p = static_cast<const char*>(src);
  while (size > 0) {
    // 64 MiB at a time, each a sign of progress for the hang watchdog.
    const ssize_t n = ::pwrite(fd, p, std::min<uint64_t>(size, 64ull << 20), off_t(offset));
    heartbeat::progress();
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) bad(path, "cannot write at byte {}: {}", offset, std::strerror(errno));
    p += n, size -= uint64_t(n), offset += uint64_t(n);
  }
}

}  // namespace

const char* safetensors_dtype(DType dtype) { return dtype_entry(dtype).name; }

void save_safetensors(const fs::path& path, const ParamTree& tensors, const Metadata& metadata) {
  std::vector<TensorSpec> order;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) bad(path, "tensor '{}' is undefined", name);
    if (!t.device().is_cpu())
      bad(path, "tensor '{}' is on {}; copy it to the CPU first", name, t.device().str());
    order.push_back({name, t.dtype(), t.shape()});
  }
  sort_specs(order, path);
  const std::string head = header_bytes(build_header(order, metadata, path));
  AtomicFile file(path);
  file.write(head.data(), head.size());
  for (const TensorSpec& t : order) {
    const Tensor& data = tensors.at(t.name);
    file.write(data.raw(), data.nbytes());
  }
  file.commit();
}

ParamTree load_safetensors(const fs::path& path, Metadata* metadata) {
  Fd fd = open_for_reading(path);
  Header h = read_header(fd.fd, path);
  ParamTree out;
  for (const Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    read_exact(fd.fd, t.raw(), e.end - e.begin, h.data_start + e.begin, path,
               fmt::format("tensor '{}'", e.name));
    t.set_name(e.name);
    out.emplace(e.name, std::move(t));
  }
  if (metadata) *metadata = std::move(h.metadata);
  return out;
}

void load_safetensors_into(const fs::path& path, ParamTree& tensors, Metadata* metadata) {
  Fd fd = open_for_reading(path);
  Header h = read_header(fd.fd, path);
  std::map<std::string_view, const Entry*> in_file;
  for (const Entry& e : h.entries) in_file.emplace(e.name, &e);
  for (const auto& [name, t] : tensors) {
    const auto it = in_file.find(name);
    if (it == in_file.end())
      bad(path, "tensor '{}' is missing from the file ({} tensors expected, {} in the file)", name,
          tensors.size(), h.entries.size());
    const Entry& e = *it->second;
    if (!t.defined()) bad(path, "tensor '{}': the destination tensor is undefined", name);
    if (!t.device().is_cpu()) bad(path, "tensor '{}': the destination is not on the CPU", name);
    if (e.shape != t.shape() || e.dtype != t.dtype())
      bad(path, "tensor '{}' is {}{} in the file but {}{} in the destination", name,
          safetensors_dtype(e.dtype), e.shape, safetensors_dtype(t.dtype()), t.shape());
  }
  for (const Entry& e : h.entries)
    if (!tensors.count(e.name))
      bad(path, "the file has a tensor '{}' that the destination does not", e.name);
  for (auto& [name, t] : tensors) {
    const Entry& e = *in_file.at(name);
    read_exact(fd.fd, t.raw(), e.end - e.begin, h.data_start + e.begin, path,
               fmt::format("tensor '{}'", name));
  }
  if (metadata) *metadata = std::move(h.metadata);
}

AtomicFile::AtomicFile(fs::path target) : target_(std::move(target)) {
  // O_EXCL on a fresh random name (not mkstemp) so the file gets the usual
  // umask-based permissions rather than mkstemp's 0600.
  for (int attempt = 0; fd_ < 0; ++attempt) {
    tmp_ = target_;
    tmp_ += ".tmp-" + random_suffix();
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && (errno != EEXIST || attempt > 100))
      fail("cannot create '{}': {}", tmp_.string(), std::strerror(errno));
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t size) {
  REDCO_CHECK(fd_ >= 0, "'{}' was already committed", target_.string());
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, std::min<size_t>(size, 64ull << 20));
    heartbeat::progress();  // a long write is progress, not a hang
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot write '{}': {}", target_.string(), std::strerror(errno));
    p += n, size -= size_t(n);
  }
}

void AtomicFile::commit() {
  REDCO_CHECK(fd_ >= 0, "'{}' was already committed", target_.string());
  if (heartbeat::Busy busy; ::fsync(fd_) != 0)  // seconds for a large file: not a hang
    fail("cannot fsync '{}': {}", tmp_.string(), std::strerror(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("cannot close '{}': {}", tmp_.string(), std::strerror(errno));
  if (::rename(tmp_.c_str(), target_.c_str()) != 0)
    fail("cannot rename '{}' to '{}': {}", tmp_.string(), target_.string(), std::strerror(errno));
  tmp_.clear();
  fsync_directory(target_.has_parent_path() ? target_.parent_path() : fs::path("."));
}

void fsync_directory(const fs::path& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.fd < 0) fail("cannot open folder '{}': {}", dir.string(), std::strerror(errno));
  // Some filesystems cannot fsync a folder (EINVAL); they have nothing to flush.
  if (heartbeat::Busy busy; ::fsync(fd.fd) != 0 && errno != EINVAL)
    fail("cannot fsync folder '{}': {}", dir.string(), std::strerror(errno));
}

// ---- SharedSafetensorsFile ------------------------------------------------------------------

SharedSafetensorsFile::SharedSafetensorsFile(fs::path path, std::vector<TensorSpec> specs,
                                             bool creator, const Metadata& metadata)
    : path_(std::move(path)) {
  sort_specs(specs, path_);
  const std::string head = header_bytes(build_header(specs, metadata, path_));
  // Every writer derives the same offsets from the same specs.
  uint64_t offset = head.size(), total = head.size();
  for (const TensorSpec& t : specs) total += spec_bytes(t);
  for (TensorSpec& t : specs) {
    const uint64_t bytes = spec_bytes(t);
    std::string name = t.name;  // named before `t` moves into its slot
    slots_.emplace(std::move(name), Slot{std::move(t), offset});
    offset += bytes;
  }
  const int flags = creator ? O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC : O_WRONLY | O_CLOEXEC;
  fd_ = ::open(path_.c_str(), flags, 0666);
  if (fd_ < 0) bad(path_, "cannot open for writing: {}", std::strerror(errno));
  if (!creator) return;
  write_exact(fd_, head.data(), head.size(), 0, path_);
  // Sized up front, so writers that finish early leave no short file behind.
  if (::ftruncate(fd_, off_t(total)) != 0)
    bad(path_, "cannot size the file to {} bytes: {}", total, std::strerror(errno));
}

SharedSafetensorsFile::~SharedSafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

void SharedSafetensorsFile::write(const std::string& name, const Tensor& t) {
  const auto it = slots_.find(name);
  if (it == slots_.end()) bad(path_, "tensor '{}' is not in the header", name);
  const TensorSpec& spec = it->second.spec;
  if (!t.defined() || !t.device().is_cpu())
    bad(path_, "tensor '{}' must be a defined CPU tensor", name);
  if (t.shape() != spec.shape || t.dtype() != spec.dtype)
    bad(path_, "tensor '{}' is {}{} but the header says {}{}", name, safetensors_dtype(t.dtype()),
        t.shape(), safetensors_dtype(spec.dtype), spec.shape);
  write_exact(fd_, t.raw(), t.nbytes(), it->second.offset, path_);
}

void SharedSafetensorsFile::close() {
  if (fd_ < 0) return;
  if (heartbeat::Busy busy; ::fsync(fd_) != 0)  // seconds for a large file: not a hang
    bad(path_, "cannot fsync: {}", std::strerror(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) bad(path_, "cannot close: {}", std::strerror(errno));
}

// ---- SafetensorsReader ----------------------------------------------------------------------

struct SafetensorsReader::Impl {
  int fd = -1;
  Header header;
  std::map<std::string_view, const Entry*> by_name;
};

SafetensorsReader::SafetensorsReader(fs::path path)
    : path_(std::move(path)), impl_(std::make_unique<Impl>()) {
  Fd fd = open_for_reading(path_);
  impl_->header = read_header(fd.fd, path_);
  for (const Entry& e : impl_->header.entries) impl_->by_name.emplace(e.name, &e);
  impl_->fd = std::exchange(fd.fd, -1);
}

SafetensorsReader::~SafetensorsReader() {
  if (impl_ && impl_->fd >= 0) ::close(impl_->fd);
}

std::vector<TensorSpec> SafetensorsReader::specs() const {
  std::vector<TensorSpec> out;
  for (const Entry& e : impl_->header.entries) out.push_back({e.name, e.dtype, e.shape});
  return out;
}

bool SafetensorsReader::contains(std::string_view name) const {
  return impl_->by_name.count(name) > 0;
}

Tensor SafetensorsReader::read(std::string_view name) const {
  const auto it = impl_->by_name.find(name);
  if (it == impl_->by_name.end()) bad(path_, "tensor '{}' is missing from the file", name);
  const Entry& e = *it->second;
  Tensor t = Tensor::empty(e.shape, e.dtype);
  read_exact(impl_->fd, t.raw(), e.end - e.begin, impl_->header.data_start + e.begin, path_,
             fmt::format("tensor '{}'", e.name));
  t.set_name(e.name);
  return t;
}

Tensor SafetensorsReader::read_block(std::string_view name, int64_t row_begin, int64_t row_end,
                                     int64_t col_begin, int64_t col_end) const {
  const auto it = impl_->by_name.find(name);
  if (it == impl_->by_name.end()) bad(path_, "tensor '{}' is missing from the file", name);
  const Entry& e = *it->second;
  if (e.shape.rank() < 1 || e.shape.rank() > 2)
    bad(path_, "tensor '{}' has shape {}: a block read needs 1 or 2 dims", e.name, e.shape);
  const int64_t rows = e.shape[0], cols = e.shape.rank() == 2 ? e.shape[1] : 1;
  REDCO_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= rows && 0 <= col_begin &&
                  col_begin <= col_end && col_end <= cols,
              "read_block: rows [{}, {}) and columns [{}, {}) are outside tensor '{}' of shape {}",
              row_begin, row_end, col_begin, col_end, e.name, e.shape);
  const int64_t n_rows = row_end - row_begin, n_cols = col_end - col_begin;
  const uint64_t es = dtype_size(e.dtype);
  Tensor t = e.shape.rank() == 2 ? Tensor::empty(Shape{n_rows, n_cols}, e.dtype)
                                 : Tensor::empty(Shape{n_rows}, e.dtype);
  const uint64_t start = impl_->header.data_start + e.begin;
  const std::string what = fmt::format("tensor '{}'", e.name);
  auto* dst = static_cast<char*>(t.raw());
  if (n_cols == cols || n_rows == 1) {  // one contiguous range
    const uint64_t off = start + (uint64_t(row_begin) * uint64_t(cols) + uint64_t(col_begin)) * es;
    read_exact(impl_->fd, dst, uint64_t(n_rows * n_cols) * es, off, path_, what);
  } else {
    for (int64_t r = 0; r < n_rows; ++r) {
      const uint64_t off =
          start + (uint64_t(row_begin + r) * uint64_t(cols) + uint64_t(col_begin)) * es;
      read_exact(impl_->fd, dst + uint64_t(r * n_cols) * es, uint64_t(n_cols) * es, off, path_,
                 what);
    }
  }
  return t;
}

}  // namespace redco::io
