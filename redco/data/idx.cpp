#include "redco/data/idx.hpp"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <type_traits>

#include "redco/core/error.hpp"

namespace redco::data {

std::string_view idx_type_name(IdxType t) {
  switch (t) {
    case IdxType::u8:
      return "u8";
    case IdxType::i8:
      return "i8";
    case IdxType::i16:
      return "i16";
    case IdxType::i32:
      return "i32";
    case IdxType::f32:
      return "f32";
    case IdxType::f64:
      return "f64";
  }
  return "unknown";
}

size_t idx_type_size(IdxType t) {
  switch (t) {
    case IdxType::u8:
    case IdxType::i8:
      return 1;
    case IdxType::i16:
      return 2;
    case IdxType::i32:
    case IdxType::f32:
      return 4;
    case IdxType::f64:
      return 8;
  }
  return 0;
}

int64_t IdxArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> IdxArray::to_float() const {
  return std::visit(
      [](const auto& v) {
        std::vector<float> out(v.size());
        std::transform(v.begin(), v.end(), out.begin(), [](auto x) { return float(x); });
        return out;
      },
      data);
}

void IdxArray::fail_wrong_type(std::string_view requested) const {
  fail("{}: IDX data is {}, not {}; call values<> with the stored type or use to_float()", path,
       idx_type_name(type), requested);
}

namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<gzFile_s, GzCloser>;

// True when the file starts with the gzip magic 1f 8b.
bool is_gzip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char magic[2] = {0, 0};
  in.read(reinterpret_cast<char*>(magic), 2);
  return in.gcount() == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

// Reads up to n bytes, looping because gzread takes an unsigned int length.
// Returns how many bytes arrived; a short count means end of (decompressed) data.
size_t read_some(gzFile f, void* dst, size_t n, const std::string& path) {
  auto* out = static_cast<unsigned char*>(dst);
  size_t got = 0;
  while (got < n) {
    const unsigned chunk = unsigned(std::min<size_t>(n - got, size_t(1) << 30));
    const int r = gzread(f, out + got, chunk);
    if (r < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      fail("{}: read failed ({}); the file is damaged, download or reinstall it", path, msg);
    }
    if (r == 0) break;
    got += size_t(r);
  }
  return got;
}

GzPtr open_idx(const std::string& path) {
  std::error_code ec;
  REDCO_CHECK(std::filesystem::exists(path, ec), "{}: no such file; check the path", path);
  REDCO_CHECK(!std::filesystem::is_directory(path, ec),
              "{}: is a directory, expected an IDX file inside it", path);
  // gzopen reads plain files as they are, so one code path serves both.
  GzPtr f(gzopen(path.c_str(), "rb"));
  REDCO_CHECK(f != nullptr, "{}: cannot open ({}); check its permissions", path,
              std::strerror(errno));
  gzbuffer(f.get(), 1 << 20);
  return f;
}

struct Header {
  IdxType type;
  std::vector<int64_t> shape;
  size_t payload_bytes;  // numel * element size
  size_t header_bytes;   // 4 + 4 * ndims
};

uint32_t load_be32(const unsigned char* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

[[noreturn]] void fail_truncated(const std::string& path, bool gz, size_t expected, size_t got) {
  fail(
      "{}: truncated IDX file: expected {} bytes{}, got {}; the download is incomplete, fetch or "
      "reinstall it",
      path, expected, gz ? " after decompression" : "", got);
}

Header read_header(gzFile f, const std::string& path, bool gz) {
  unsigned char magic[4];
  const size_t got = read_some(f, magic, 4, path);
  if (got < 4) fail_truncated(path, gz, 4, got);
  const unsigned code = magic[2];
  const bool known = code == 0x08 || code == 0x09 || (code >= 0x0B && code <= 0x0E);
  REDCO_CHECK(magic[0] == 0 && magic[1] == 0 && known,
              "{}: not an IDX file: magic bytes {:02x} {:02x} {:02x} {:02x}, expected 00 00 "
              "<type 08/09/0b/0c/0d/0e> <ndims>",
              path, magic[0], magic[1], magic[2], magic[3]);
  Header h{IdxType(code), {}, 0, 4 + 4 * size_t(magic[3])};
  REDCO_CHECK(magic[3] >= 1, "{}: IDX header declares 0 dimensions; the file is malformed", path);

  std::vector<unsigned char> dims(4 * size_t(magic[3]));
  const size_t got_dims = read_some(f, dims.data(), dims.size(), path);
  if (got_dims < dims.size()) fail_truncated(path, gz, h.header_bytes, 4 + got_dims);
  // Bound the element count so a corrupt header cannot overflow size_t.
  const size_t elem = idx_type_size(h.type);
  size_t numel = 1;
  for (size_t i = 0; i < magic[3]; ++i) {
    const uint32_t d = load_be32(&dims[4 * i]);
    h.shape.push_back(int64_t(d));
    REDCO_CHECK(d == 0 || numel <= (size_t(1) << 46) / d,
                "{}: IDX header declares an implausibly large array; the file is corrupt", path);
    numel *= d;
  }
  h.payload_bytes = numel * elem;
  return h;
}

template <typename U>
U byteswap(U v) {
  U r = 0;
  for (size_t i = 0; i < sizeof(U); ++i) r = U(r << 8) | U((v >> (8 * i)) & 0xff);
  return r;
}

// IDX is big-endian; flip each element in place on little-endian hosts.
template <typename T>
void to_host_order(std::vector<T>& v) {
  if constexpr (sizeof(T) > 1 && std::endian::native == std::endian::little) {
    using U = std::conditional_t<sizeof(T) == 2, uint16_t,
                                 std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
    for (T& x : v) x = std::bit_cast<T>(byteswap(std::bit_cast<U>(x)));
  }
}

IdxArray::Storage make_storage(IdxType t) {
  switch (t) {
    case IdxType::u8:
      return std::vector<uint8_t>{};
    case IdxType::i8:
      return std::vector<int8_t>{};
    case IdxType::i16:
      return std::vector<int16_t>{};
    case IdxType::i32:
      return std::vector<int32_t>{};
    case IdxType::f32:
      return std::vector<float>{};
    case IdxType::f64:
      return std::vector<double>{};
  }
  return std::vector<uint8_t>{};
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  GzPtr f = open_idx(path);
  const bool gz = is_gzip(path);
  const Header h = read_header(f.get(), path, gz);
  IdxArray a{path, h.type, h.shape, make_storage(h.type)};
  const size_t numel = h.payload_bytes / idx_type_size(h.type);
  if (!gz) {
    // A header can promise far more than the file holds: check before allocating.
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec && size < h.header_bytes + h.payload_bytes)
      fail_truncated(path, gz, h.header_bytes + h.payload_bytes, size_t(size));
  }
  std::visit(
      [&](auto& v) {
        // Grown as the data arrives (compressed sizes say little about the
        // payload), so a lying header fails on the data, not on a huge allocation.
        using T = typename std::decay_t<decltype(v)>::value_type;
        const size_t chunk = std::max<size_t>(1, (size_t(1) << 20) / sizeof(T));
        v.reserve(gz ? std::min(numel, chunk) : numel);
        for (size_t have = 0; have < numel;) {
          const size_t n = std::min(numel - have, chunk);
          v.resize(have + n);
          const size_t got = read_some(f.get(), v.data() + have, n * sizeof(T), path);
          if (got < n * sizeof(T))
            fail_truncated(path, gz, h.header_bytes + h.payload_bytes,
                           h.header_bytes + have * sizeof(T) + got);
          have += n;
        }
        to_host_order(v);
      },
      a.data);
  unsigned char extra[1];
  REDCO_CHECK(read_some(f.get(), extra, 1, path) == 0,
              "{}: {} bytes of IDX data{} but the file continues; it is not a single IDX array",
              path, h.header_bytes + h.payload_bytes, gz ? " after decompression" : "");
  return a;
}

namespace {

// The file for `stem` in `dir`: the shipped .gz, or an uncompressed copy.
std::string fashion_file(const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  const fs::path gz = fs::path(dir) / (stem + ".gz");
  const fs::path plain = fs::path(dir) / stem;
  std::error_code ec;
  if (fs::exists(gz, ec)) return gz.string();
  if (fs::exists(plain, ec)) return plain.string();
  fail(
      "Fashion-MNIST file {} not found; install the dataset with `sudo apt-get install "
      "dataset-fashion-mnist` or pass the directory that holds {}.gz to load_fashion_mnist",
      gz.string(), stem);
}

}  // namespace

FashionMnist load_fashion_mnist(const std::string& dir, const std::string& split) {
  REDCO_CHECK(split == "train" || split == "test",
              "load_fashion_mnist: unknown split '{}'; use \"train\" or \"test\"", split);
  const std::string prefix = split == "train" ? "train" : "t10k";
  const IdxArray img = read_idx(fashion_file(dir, prefix + "-images-idx3-ubyte"));
  const IdxArray lab = read_idx(fashion_file(dir, prefix + "-labels-idx1-ubyte"));
  REDCO_CHECK(img.type == IdxType::u8 && img.shape.size() == 3,
              "{}: expected u8 images of shape [N, rows, cols], got {} with {} dims; wrong file?",
              img.path, idx_type_name(img.type), img.shape.size());
  REDCO_CHECK(lab.type == IdxType::u8 && lab.shape.size() == 1,
              "{}: expected u8 labels of shape [N], got {} with {} dims; wrong file?", lab.path,
              idx_type_name(lab.type), lab.shape.size());
  REDCO_CHECK(img.shape[0] == lab.shape[0],
              "Fashion-MNIST {} split: {} holds {} images but {} holds {} labels; the files come "
              "from different splits or one is damaged, reinstall dataset-fashion-mnist",
              split, img.path, img.shape[0], lab.path, lab.shape[0]);

  FashionMnist out;
  out.count = img.shape[0];
  out.rows = img.shape[1];
  out.cols = img.shape[2];
  const auto& px = img.values<uint8_t>();
  out.images.resize(px.size());
  std::transform(px.begin(), px.end(), out.images.begin(),
                 [](uint8_t p) { return float(p) / 255.0f; });
  const auto& lb = lab.values<uint8_t>();
  for (size_t i = 0; i < lb.size(); ++i) {
    REDCO_CHECK(lb[i] <= 9, "{}: label {} at index {} is outside 0..9; the file is damaged",
                lab.path, lb[i], i);
  }
  out.labels.assign(lb.begin(), lb.end());
  return out;
}

}  // namespace redco::data
