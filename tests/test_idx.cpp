// IDX reader: files are written byte by byte here (not with a writer from the
// library) so the tests pin the on-disk format, not just a round trip.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/data/idx.hpp"
#include "skip.hpp"

namespace fs = std::filesystem;
using redco::data::IdxArray;
using redco::data::IdxType;
using redco::data::read_idx;
using Bytes = std::vector<unsigned char>;

namespace {

// A fresh directory per test case, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("redco_idx_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

void put_be(Bytes& out, uint64_t v, size_t nbytes) {
  for (size_t i = nbytes; i-- > 0;) out.push_back((v >> (8 * i)) & 0xff);
}

Bytes header(IdxType t, const std::vector<uint32_t>& shape) {
  Bytes b = {0, 0, uint8_t(t), uint8_t(shape.size())};
  for (uint32_t d : shape) put_be(b, d, 4);
  return b;
}

// Header plus values encoded big-endian through their bit pattern.
template <typename T, typename U>
Bytes idx_bytes(IdxType t, const std::vector<uint32_t>& shape, const std::vector<T>& vals) {
  Bytes b = header(t, shape);
  for (T v : vals) put_be(b, std::bit_cast<U>(v), sizeof(T));
  return b;
}

void write_plain(const std::string& path, const Bytes& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}

void write_gz(const std::string& path, const Bytes& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, b.data(), unsigned(b.size())) == int(b.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

// The redco::Error message `f` throws; fails the test if it does not throw one.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const redco::Error& e) {
    return e.what();
  }
  FAIL("expected a redco::Error");
  return {};
}

}  // namespace

TEST_CASE("idx reads u8 and keeps shape", "[data]") {
  TempDir dir;
  Bytes b = header(IdxType::u8, {2, 3});
  for (uint8_t v : {0, 1, 2, 127, 200, 255}) b.push_back(v);
  write_plain(dir.file("a.idx"), b);

  const IdxArray a = read_idx(dir.file("a.idx"));
  CHECK(a.type == IdxType::u8);
  CHECK(a.shape == std::vector<int64_t>{2, 3});
  CHECK(a.numel() == 6);
  CHECK(a.values<uint8_t>() == std::vector<uint8_t>{0, 1, 2, 127, 200, 255});
  CHECK(a.to_float() == std::vector<float>{0, 1, 2, 127, 200, 255});
}

TEST_CASE("idx multi-byte types are big-endian on disk", "[data]") {
  TempDir dir;
  // Hand-written bytes: 0x1234, 0xFFFE (-2), 0x8000 (-32768).
  Bytes b = header(IdxType::i16, {3});
  for (uint8_t v : {0x12, 0x34, 0xFF, 0xFE, 0x80, 0x00}) b.push_back(v);
  write_plain(dir.file("i16.idx"), b);
  CHECK(read_idx(dir.file("i16.idx")).values<int16_t>() ==
        std::vector<int16_t>{0x1234, -2, -32768});

  Bytes c = header(IdxType::i32, {1});
  for (uint8_t v : {0x01, 0x02, 0x03, 0x04}) c.push_back(v);
  write_plain(dir.file("i32.idx"), c);
  CHECK(read_idx(dir.file("i32.idx")).values<int32_t>() == std::vector<int32_t>{0x01020304});

  Bytes d = header(IdxType::f32, {1});
  for (uint8_t v : {0x3F, 0xC0, 0x00, 0x00}) d.push_back(v);  // 1.5f
  write_plain(dir.file("f32.idx"), d);
  CHECK(read_idx(dir.file("f32.idx")).values<float>() == std::vector<float>{1.5f});
}

TEST_CASE("idx reads every element type, plain and gzip", "[data]") {
  TempDir dir;
  const bool gz = GENERATE(false, true);
  const auto write = [&](const std::string& name, const Bytes& b) {
    const std::string p = dir.file(name + (gz ? ".gz" : ""));
    gz ? write_gz(p, b) : write_plain(p, b);
    return p;
  };

  const std::vector<int8_t> i8 = {-128, -1, 0, 1, 127, 5};
  const IdxArray a8 = read_idx(write("i8", idx_bytes<int8_t, uint8_t>(IdxType::i8, {3, 2}, i8)));
  CHECK(a8.type == IdxType::i8);
  CHECK(a8.shape == std::vector<int64_t>{3, 2});
  CHECK(a8.values<int8_t>() == i8);

  const std::vector<int32_t> i32 = {-2147483647 - 1, -70000, 0, 70000, 2147483647, 1};
  const IdxArray a32 =
      read_idx(write("i32", idx_bytes<int32_t, uint32_t>(IdxType::i32, {1, 2, 3}, i32)));
  CHECK(a32.shape == std::vector<int64_t>{1, 2, 3});
  CHECK(a32.values<int32_t>() == i32);

  const std::vector<float> f32 = {-0.5f, 3.25f, 1e-30f, -1e30f};
  const IdxArray af = read_idx(write("f32", idx_bytes<float, uint32_t>(IdxType::f32, {4}, f32)));
  CHECK(af.values<float>() == f32);

  const std::vector<double> f64 = {3.141592653589793, -2.5e-300, 1e300, 0.0};
  const IdxArray ad =
      read_idx(write("f64", idx_bytes<double, uint64_t>(IdxType::f64, {2, 2}, f64)));
  CHECK(ad.type == IdxType::f64);
  CHECK(ad.values<double>() == f64);
  const std::vector<float> adf = ad.to_float();
  CHECK(adf[0] == 3.14159274f);
  CHECK(adf[1] == 0.0f);  // underflows to -0
  CHECK(std::isinf(adf[2]));
}

TEST_CASE("idx accepts a zero-sized dimension", "[data]") {
  TempDir dir;
  write_plain(dir.file("empty.idx"), header(IdxType::f32, {0, 28}));
  const IdxArray a = read_idx(dir.file("empty.idx"));
  CHECK(a.shape == std::vector<int64_t>{0, 28});
  CHECK(a.values<float>().empty());
}

TEST_CASE("idx errors name the file and the problem", "[data]") {
  TempDir dir;
  Bytes good = header(IdxType::i16, {2, 2});
  for (int i = 0; i < 8; ++i) good.push_back(uint8_t(i));

  SECTION("truncated plain file") {
    const std::string p = dir.file("short.idx");
    write_plain(p, Bytes(good.begin(), good.end() - 3));
    const std::string msg = error_of([&] { read_idx(p); });
    CHECK_THAT(msg, Catch::Contains(p) && Catch::Contains("expected 20 bytes") &&
                        Catch::Contains("got 17"));
  }
  SECTION("truncated gzip file") {
    const std::string p = dir.file("short.idx.gz");
    write_gz(p, Bytes(good.begin(), good.end() - 1));
    const std::string msg = error_of([&] { read_idx(p); });
    CHECK_THAT(msg, Catch::Contains(p) &&
                        Catch::Contains("expected 20 bytes after decompression") &&
                        Catch::Contains("got 19"));
  }
  SECTION("truncated header") {
    const std::string p = dir.file("hdr.idx");
    write_plain(p, Bytes(good.begin(), good.begin() + 6));
    CHECK_THAT(error_of([&] { read_idx(p); }), Catch::Contains(p) && Catch::Contains("got 6"));
  }
  SECTION("bad magic") {
    const std::string p = dir.file("zip.idx");
    write_plain(p, Bytes{'P', 'K', 3, 4, 0, 0, 0, 0});
    CHECK_THAT(error_of([&] { read_idx(p); }), Catch::Contains(p) &&
                                                   Catch::Contains("not an IDX file") &&
                                                   Catch::Contains("50 4b"));
  }
  SECTION("unknown type code") {
    const std::string p = dir.file("type.idx");
    write_plain(p, Bytes{0, 0, 0x0A, 1, 0, 0, 0, 0});
    CHECK_THAT(error_of([&] { read_idx(p); }),
               Catch::Contains(p) && Catch::Contains("00 00 0a 01"));
  }
  SECTION("trailing bytes") {
    const std::string p = dir.file("long.idx");
    Bytes b = good;
    b.push_back(0);
    write_plain(p, b);
    CHECK_THAT(error_of([&] { read_idx(p); }), Catch::Contains(p) && Catch::Contains("continues"));
  }
  SECTION("a header that promises far more than the file holds") {
    // 2^44 f64 elements (128 TiB) in a 16-byte file: a clear error, not an
    // attempt to allocate it first (found by tests/fuzz/fuzz_idx.cpp).
    const bool gz = GENERATE(false, true);
    const std::string p = dir.file(gz ? "huge.idx.gz" : "huge.idx");
    const Bytes b = header(IdxType::f64, {1u << 20, 1u << 20, 16});
    gz ? write_gz(p, b) : write_plain(p, b);
    CHECK_THAT(error_of([&] { read_idx(p); }),
               Catch::Contains(p) && Catch::Contains("truncated IDX file") &&
                   Catch::Contains("expected 140737488355344 bytes") && Catch::Contains("got 16"));
  }
  SECTION("missing file") {
    const std::string p = dir.file("nope.idx");
    CHECK_THAT(error_of([&] { read_idx(p); }),
               Catch::Contains(p) && Catch::Contains("no such file"));
  }
  SECTION("values of the wrong type") {
    const std::string p = dir.file("ok.idx");
    write_plain(p, good);
    const IdxArray a = read_idx(p);
    CHECK_THAT(error_of([&] { a.values<float>(); }),
               Catch::Contains(p) && Catch::Contains("i16, not f32"));
  }
}

TEST_CASE("load_fashion_mnist validates a small synthetic copy", "[data]") {
  TempDir dir;
  Bytes img = header(IdxType::u8, {2, 2, 2});
  for (uint8_t v : {0, 51, 102, 255, 255, 0, 0, 255}) img.push_back(v);
  write_gz(dir.file("train-images-idx3-ubyte.gz"), img);
  // Uncompressed names are accepted too.
  write_plain(dir.file("train-labels-idx1-ubyte"), Bytes{0, 0, 8, 1, 0, 0, 0, 2, 9, 3});

  const auto ds = redco::data::load_fashion_mnist(dir.path.string(), "train");
  CHECK(ds.count == 2);
  CHECK(ds.rows == 2);
  CHECK(ds.cols == 2);
  CHECK(ds.images == std::vector<float>{0.0f, 0.2f, 0.4f, 1.0f, 1.0f, 0.0f, 0.0f, 1.0f});
  CHECK(ds.labels == std::vector<int64_t>{9, 3});

  SECTION("count mismatch") {
    write_plain(dir.file("train-labels-idx1-ubyte"), Bytes{0, 0, 8, 1, 0, 0, 0, 1, 4});
    CHECK_THAT(error_of([&] { redco::data::load_fashion_mnist(dir.path.string(), "train"); }),
               Catch::Contains("2 images but") && Catch::Contains("1 labels"));
  }
  SECTION("label out of range") {
    write_plain(dir.file("train-labels-idx1-ubyte"), Bytes{0, 0, 8, 1, 0, 0, 0, 2, 1, 10});
    CHECK_THAT(error_of([&] { redco::data::load_fashion_mnist(dir.path.string(), "train"); }),
               Catch::Contains("label 10 at index 1"));
  }
  SECTION("missing split files") {
    const std::string msg =
        error_of([&] { redco::data::load_fashion_mnist(dir.path.string(), "test"); });
    CHECK_THAT(msg, Catch::Contains(dir.file("t10k-images-idx3-ubyte.gz")) &&
                        Catch::Contains("sudo apt-get install dataset-fashion-mnist"));
  }
  SECTION("unknown split") {
    CHECK_THAT(error_of([&] { redco::data::load_fashion_mnist(dir.path.string(), "valid"); }),
               Catch::Contains("'valid'"));
  }
}

TEST_CASE("load_fashion_mnist reads the installed dataset", "[data][fashion]") {
  if (!fs::exists(redco::data::kFashionMnistDir)) {
    redco::test::skip(std::string(redco::data::kFashionMnistDir) +
                      " missing (sudo apt-get install dataset-fashion-mnist)");
  }
  const auto train = redco::data::load_fashion_mnist();
  REQUIRE(train.count == 60000);
  CHECK(train.rows == 28);
  CHECK(train.cols == 28);
  REQUIRE(train.images.size() == size_t(60000) * 28 * 28);
  REQUIRE(train.labels.size() == 60000);
  std::array<int64_t, 10> per_class{};
  int64_t out_of_range = 0;
  for (int64_t l : train.labels) {
    if (l < 0 || l > 9) {
      ++out_of_range;
      continue;
    }
    ++per_class[size_t(l)];
  }
  CHECK(out_of_range == 0);
  for (int64_t c : per_class) CHECK(c == 6000);
  float lo = 1.0f, hi = 0.0f;
  for (float p : train.images) lo = std::min(lo, p), hi = std::max(hi, p);
  CHECK(lo == 0.0f);
  CHECK(hi == 1.0f);

  const auto test = redco::data::load_fashion_mnist(redco::data::kFashionMnistDir, "test");
  CHECK(test.count == 10000);
  CHECK(test.images.size() == size_t(10000) * 28 * 28);
  CHECK(test.labels.size() == 10000);
}
