// io::write_png / write_image_grid: the file read back by an independent
// decoder in C++ (chunk CRCs, zlib inflate) and, as the [python] case, by
// Python's zlib and Pillow (tests/python/read_png.py).
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "redco/io/png.hpp"
#include "skip.hpp"

using namespace redco;
namespace fs = std::filesystem;

namespace {
fs::path temp_dir() {
  std::string tmpl = (fs::temp_directory_path() / "redco-test-png-XXXXXX").string();
  REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

uint32_t be32(const std::vector<uint8_t>& d, size_t at) {
  return uint32_t(d[at]) << 24 | uint32_t(d[at + 1]) << 16 | uint32_t(d[at + 2]) << 8 | d[at + 3];
}

struct Decoded {
  int64_t width = 0, height = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;
};

// Reads what write_png writes: signature, CRC-checked chunks, one zlib stream of filter-0 rows.
Decoded decode(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::vector<uint8_t> d((std::istreambuf_iterator<char>(in)), {});
  REQUIRE(d.size() > 8);
  CHECK(std::equal(d.begin(), d.begin() + 8,
                   std::vector<uint8_t>{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'}.begin()));
  Decoded out;
  std::vector<uint8_t> idat;
  for (size_t pos = 8; pos + 12 <= d.size();) {
    const uint32_t len = be32(d, pos);
    const std::string type(d.begin() + long(pos) + 4, d.begin() + long(pos) + 8);
    CHECK(crc32(0L, d.data() + pos + 4, len + 4) == be32(d, pos + 8 + len));
    if (type == "IHDR") {
      out.width = be32(d, pos + 8), out.height = be32(d, pos + 12);
      CHECK(d[pos + 16] == 8);
      out.channels = d[pos + 17] == 0 ? 1 : d[pos + 17] == 2 ? 3 : -1;
    } else if (type == "IDAT") {
      idat.insert(idat.end(), d.begin() + long(pos) + 8, d.begin() + long(pos + 8 + len));
    }
    pos += 12 + len;
  }
  const size_t row = size_t(out.width * out.channels);
  std::vector<uint8_t> raw((row + 1) * size_t(out.height));
  uLongf n = raw.size();
  REQUIRE(uncompress(raw.data(), &n, idat.data(), uLong(idat.size())) == Z_OK);
  REQUIRE(n == raw.size());
  for (int64_t y = 0; y < out.height; ++y) {
    CHECK(raw[size_t(y) * (row + 1)] == 0);
    out.pixels.insert(out.pixels.end(), raw.begin() + long(size_t(y) * (row + 1) + 1),
                      raw.begin() + long(size_t(y + 1) * (row + 1)));
  }
  return out;
}

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t((i * 37 + i / 7) % 256);
  return v;
}
}  // namespace

TEST_CASE("write_png: gray and RGB images decode to the bytes written", "[png]") {
  const fs::path dir = temp_dir();
  for (int channels : {1, 3}) {
    const auto px = pattern(size_t(13 * 5 * channels));
    io::write_png(dir / "a.png", px, 13, 5, channels);
    const Decoded got = decode(dir / "a.png");
    CHECK(got.width == 13);
    CHECK(got.height == 5);
    CHECK(got.channels == channels);
    CHECK(got.pixels == px);
  }
  CHECK_THROWS_WITH(io::write_png(dir / "b.png", pattern(10), 13, 5, 1),
                    Catch::Contains("10 bytes given for 13x5"));
  CHECK_THROWS_WITH(io::write_png(dir / "no/such/dir/c.png", pattern(65), 13, 5, 1),
                    Catch::Contains("cannot write"));
  fs::remove_all(dir);
}

TEST_CASE("write_image_grid tiles images in [lo, hi] with gaps", "[png]") {
  const fs::path dir = temp_dir();
  // 3 images 2x2: image n has value (n - 1) everywhere except pixel (0, 0) = 1.
  std::vector<float> v(12);
  for (int n = 0; n < 3; ++n)
    for (int i = 0; i < 4; ++i) v[size_t(n * 4 + i)] = i == 0 ? 1.f : float(n - 1);
  io::write_image_grid(dir / "g.png", Tensor::from<float>(v, {3, 1, 2, 2}), 2, -1.f, 1.f, 1);
  const Decoded got = decode(dir / "g.png");
  REQUIRE(got.width == 5);  // 2 columns of 2 + a gap of 1
  REQUIRE(got.height == 5);
  auto at = [&](int x, int y) { return int(got.pixels[size_t(y * 5 + x)]); };
  CHECK(at(0, 0) == 255);
  CHECK(at(1, 1) == 0);    // image 0: -1
  CHECK(at(4, 1) == 128);  // image 1: 0 -> 127.5 rounds to 128
  CHECK(at(2, 0) == 0);    // the gap
  CHECK(at(1, 4) == 255);  // image 2: 1
  CHECK(at(4, 4) == 0);    // the empty cell
  fs::remove_all(dir);
}

TEST_CASE("write_png: Python's zlib and Pillow read the same pixels", "[png][python]") {
  fs::path root;
  std::error_code ec;
  for (fs::path p = fs::absolute(fs::path(__FILE__).parent_path().parent_path(), ec); !p.empty();
       p = p.parent_path()) {
    if (fs::exists(p / "tests/python/read_png.py", ec)) {
      root = p;
      break;
    }
    if (p == p.parent_path()) break;
  }
  if (root.empty()) test::skip("cannot find tests/python/read_png.py");
  const std::string python = test::python_or_skip(root, "zlib, struct");
  const fs::path dir = temp_dir();
  for (int channels : {1, 3}) {
    const auto px = pattern(size_t(9 * 4 * channels));
    io::write_png(dir / "p.png", px, 9, 4, channels);
    const std::string cmd = "'" + python + "' '" + (root / "tests/python/read_png.py").string() +
                            "' '" + (dir / "p.png").string() + "' 2>&1";
    FILE* pipe = ::popen(cmd.c_str(), "r");
    REQUIRE(pipe);
    std::string out;
    char buf[4096];
    while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
    const int status = ::pclose(pipe);
    INFO(out);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    long sum = 0;
    std::string hex;
    for (uint8_t b : px) sum += b, hex += fmt::format("{:02x}", b);
    CHECK(out == fmt::format("9 4 {} {} {}\n", channels, sum, hex));
  }
  fs::remove_all(dir);
}
