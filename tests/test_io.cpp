// safetensors files, checkpoints and io::Json; the interop tests run the real
// Python `safetensors` package from the repository's .venv (tools/setup test).
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "redco/io/checkpoint.hpp"
#include "redco/io/json.hpp"
#include "redco/io/safetensors.hpp"
#include "skip.hpp"

using namespace redco;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A fresh folder under the system temp dir, deleted at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / fmt::format("redco-test-io-{}-{}", ::getpid(), counter++);
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path operator/(const std::string& name) const { return path / name; }
};

size_t count_entries(const fs::path& dir) {
  return size_t(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

template <typename T>
T load_as(const Tensor& t, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(t.raw()) + i * sizeof(T), sizeof(T));
  return v;
}

// Element i as a double, for every dtype.
double element(const Tensor& t, int64_t i) {
  const DType d = t.dtype();
  if (d == DType::bf16) return bf16_to_float(load_as<uint16_t>(t, i));
  if (d == DType::f16) return f16_to_float(load_as<uint16_t>(t, i));
  if (d == DType::i32) return load_as<int32_t>(t, i);
  if (d == DType::i64) return double(load_as<int64_t>(t, i));
  if (d == DType::u8) return load_as<uint8_t>(t, i);
  return load_as<float>(t, i);
}

// Deterministic values, exact in every dtype: (i * 5 + seed) % 17 - 8, in quarters for floats.
Tensor make(DType dtype, const Shape& shape, int seed = 0) {
  Tensor t = Tensor::empty(shape, dtype);
  const size_t size = dtype_size(dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int v = int((i * 5 + seed) % 17) - 8;
    const float f = v * 0.25f;
    const uint16_t half = dtype == DType::bf16 ? float_to_bf16(f) : float_to_f16(f);
    const int32_t i32 = v * 1000003;
    const int64_t i64 = int64_t(v) << 40;
    const uint8_t u8 = uint8_t(v + 8);
    const void* src = dtype == DType::f32   ? &f
                      : size == 2           ? static_cast<const void*>(&half)
                      : dtype == DType::i32 ? static_cast<const void*>(&i32)
                      : dtype == DType::i64 ? static_cast<const void*>(&i64)
                                            : &u8;
    std::memcpy(static_cast<char*>(t.raw()) + i * size, src, size);
  }
  return t;
}

// sum_i (i + 1) * value[i], as read_safetensors.py computes it.
double checksum(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += double(i + 1) * element(t, i);
  return s;
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

void check_same_tree(const ParamTree& a, const ParamTree& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO("tensor " << name);
    REQUIRE(b.count(name));
    CHECK(same_tensor(t, b.at(name)));
  }
}

// The message of the redco::Error that f throws.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("expected a redco::Error");
  return "";
}

ParamTree every_dtype() {
  return {{"h.0.attn.q_proj.weight", make(DType::f32, {3, 4}, 1)},
          {"h.0.ln.bias", make(DType::bf16, {5}, 2)},
          {"emb.half", make(DType::f16, {2, 3, 2}, 3)},
          {"ids.i32", make(DType::i32, {7}, 4)},
          {"step", make(DType::i64, {}, 5)},
          {"mask.u8", make(DType::u8, {2, 2}, 6)},
          {"ünï.名前.w", make(DType::f32, {1, 1, 1, 1, 1, 1, 1, 2}, 7)},
          {"empty", make(DType::f32, {0, 3})},
          {"empty.i64", make(DType::i64, {4, 0})}};
}

// A file with the given header text (unpadded) and data bytes.
std::string st_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = char(uint64_t(header.size()) >> (8 * i));
  return out + header + data;
}

// One header entry, spelled as the format does; `dtype` is raw JSON.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  int begin, int end) {
  return fmt::format(R"("{}":{{"dtype":{},"shape":[{}],"data_offsets":[{},{}]}})", name, dtype,
                     shape, begin, end);
}

// A header object of the given entries.
std::string header(std::initializer_list<std::string> entries) {
  std::string out("{");
  for (const auto& e : entries) out.append(out.size() > 1 ? "," : "").append(e);
  return out.append("}");
}

}  // namespace

TEST_CASE("safetensors: every dtype, scalars, empty tensors and odd names round-trip", "[io]") {
  TempDir dir;
  const ParamTree tree = every_dtype();
  const io::Metadata meta{{"format", "pt"}, {"note", "quotes \" and \\ and ünï\n"}, {"", ""}};
  io::save_safetensors(dir / "a.safetensors", tree, meta);
  io::Metadata got_meta{{"stale", "x"}};
  const ParamTree back = io::load_safetensors(dir / "a.safetensors", &got_meta);
  check_same_tree(tree, back);
  CHECK(got_meta == meta);
  CHECK(back.at("h.0.ln.bias").name() == "h.0.ln.bias");
  // Only the file itself is left: the temporary was renamed over it.
  CHECK(count_entries(dir.path) == 1);

  // Overwriting replaces the contents; no metadata reads back as empty.
  io::save_safetensors(dir / "a.safetensors", {{"x", make(DType::u8, {3})}});
  CHECK(io::load_safetensors(dir / "a.safetensors", &got_meta).size() == 1);
  CHECK(got_meta.empty());
}

TEST_CASE("safetensors: golden bytes match the reference layout", "[io]") {
  TempDir dir;
  Tensor b = Tensor::empty({2}, DType::i64);
  b.data<int64_t>()[0] = 1, b.data<int64_t>()[1] = 2;
  Tensor h = Tensor::empty({1}, DType::f16);
  *static_cast<uint16_t*>(h.raw()) = float_to_f16(1.f);
  const ParamTree tree{{"b", b},
                       {"a", Tensor::from({1.5f}, {1})},
                       {"c", Tensor::empty({0, 3}, DType::u8)},
                       {"s", Tensor::scalar(2.f)},
                       {"h", h}};
  io::save_safetensors(dir / "g.safetensors", tree, {{"k", "v"}});
  // Metadata first; then by element size (I64, F32, F16, U8) and name, as the
  // reference writer orders them; spaces pad the header to 8 bytes.
  const std::string header = R"({"__metadata__":{"k":"v"},)"
                             R"("b":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[16,20]},)"
                             R"("s":{"dtype":"F32","shape":[],"data_offsets":[20,24]},)"
                             R"("h":{"dtype":"F16","shape":[1],"data_offsets":[24,26]},)"
                             R"("c":{"dtype":"U8","shape":[0,3],"data_offsets":[26,26]}})"
                             "    ";
  REQUIRE(header.size() == 304);
  const std::string data(
      "\x01\0\0\0\0\0\0\0\x02\0\0\0\0\0\0\0"  // b: 1, 2
      "\0\0\xc0\x3f"                          // a: 1.5f
      "\0\0\0\x40"                            // s: 2.0f
      "\0\x3c",                               // h: f16 1.0
      26);
  CHECK(read_bytes(dir / "g.safetensors") ==
        std::string("\x30\x01\0\0\0\0\0\0", 8) + header + data);
}

TEST_CASE("safetensors: corrupt files are one clear error naming file and tensor", "[io]") {
  TempDir dir;
  io::save_safetensors(dir / "good",
                       {{"w", make(DType::f32, {2, 2})}, {"b", make(DType::i32, {2})}});
  const std::string good = read_bytes(dir / "good");
  std::string lie = good;
  lie[2] = '\x7f';  // header size ~8 MB
  const std::string w = entry("w", R"("F32")", "2", 0, 8), x8(8, 'x');
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {good.substr(0, good.size() - 3), {"'b'", "truncated"}},
      {std::string("\x10\0\0", 3), {"too short"}},
      {lie, {"header size"}},
      {st_file(R"({"w": {"dtype": )", x8), {"not valid JSON"}},
      {st_file("[1, 2]", ""), {"does not start with"}},
      {st_file("  {}", ""), {"does not start with"}},
      {st_file(header({entry("w", R"("F32")", "2", 8, 16)}), x8), {"'w'", "[8, 16]"}},
      {st_file(header({w, entry("v", R"("F32")", "1", 4, 8)}), x8), {"'w'", "'v'", "overlap"}},
      {st_file(header({w}), x8 + "zz"), {"[8, 10) after the last tensor"}},
      {st_file(header({entry("w", R"("U8")", "1", 1, 2)}), "zz"), {"[0, 1) belong to no"}},
      {st_file(header({entry("w", R"("F64")", "1", 0, 8)}), x8), {"'w'", "F64"}},
      {st_file(header({entry("w", "7", "1", 0, 8)}), x8), {"'w'", "dtype"}},
      {st_file(header({entry("w", R"("F32")", "3", 0, 8)}), x8), {"'w'", "12 bytes"}},
      {st_file(header({entry("w", R"("F32")", "-2", 0, 8)}), x8), {"'w'", "non-negative"}},
      {st_file(header({w, w}), x8 + x8), {"'w' twice"}},
      {st_file(R"({"w":{"dtype":"F32","shape":[2]}})", x8), {"'w' has no data_offsets"}},
      {st_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", x8),
       {"'w'", "unknown header field 'x'"}},
      {st_file(R"({"__metadata__":{"k":1}})", ""), {"__metadata__", "'k'"}},
  };
  const fs::path p = dir / "bad.safetensors";
  for (size_t i = 0; i < cases.size(); ++i) {
    write_bytes(p, cases[i].first);
    const std::string msg = error_of([&] { io::load_safetensors(p); });
    INFO("case " << i << ": " << msg);
    CHECK_THAT(msg, Contains(p.string()));
    for (const auto& part : cases[i].second) CHECK_THAT(msg, Contains(part));
  }
  CHECK_THAT(error_of([&] { io::load_safetensors(dir / "nope"); }), Contains("nope"));
}

TEST_CASE("safetensors: load_safetensors_into checks names, shapes and dtypes", "[io]") {
  TempDir dir;
  const fs::path p = dir / "m.safetensors";
  io::save_safetensors(p, {{"w", make(DType::f32, {2, 3}, 1)}, {"b", make(DType::bf16, {3}, 2)}});
  ParamTree dst{{"w", Tensor::zeros({2, 3})}, {"b", Tensor::zeros({3}, DType::bf16)}};
  const Tensor w_before = dst.at("w");
  io::load_safetensors_into(p, dst);
  CHECK(dst.at("w").same(w_before));  // filled in place
  CHECK(same_tensor(dst.at("w"), make(DType::f32, {2, 3}, 1)));
  CHECK(same_tensor(dst.at("b"), make(DType::bf16, {3}, 2)));

  ParamTree other{{"w", Tensor::zeros({2, 3})}, {"b", Tensor::zeros({3}, DType::bf16)}};
  auto into_error = [&] { return error_of([&] { io::load_safetensors_into(p, other); }); };
  SECTION("missing") {
    other.emplace("extra.weight", Tensor::zeros({1}));
    CHECK_THAT(into_error(), Contains(p.string()) && Contains("'extra.weight' is missing"));
  }
  SECTION("extra") {
    other.erase("b");
    CHECK_THAT(into_error(), Contains(p.string()) && Contains("'b'"));
  }
  SECTION("wrong shape") {
    other["w"] = Tensor::zeros({3, 2});
    CHECK_THAT(into_error(), Contains("'w'") && Contains("[2, 3]") && Contains("[3, 2]"));
  }
  SECTION("wrong dtype") {
    other["b"] = Tensor::zeros({3});
    CHECK_THAT(into_error(), Contains("'b'") && Contains("BF16") && Contains("F32"));
  }
  // Validation precedes any copy: a failed load leaves the destination as it was.
  CHECK(other.at("w").to_vector() == std::vector<float>(6, 0.f));
}

TEST_CASE("safetensors: refuses what it cannot write, leaving no file", "[io]") {
  TempDir dir;
  const fs::path p = dir / "x.safetensors";
  auto save_error = [&](const std::string& name, const Tensor& t) {
    return error_of([&] { io::save_safetensors(p, {{name, t}}); });
  };
  CHECK_THAT(save_error("w", Tensor()), Contains("'w'"));
  CHECK_THAT(save_error("__metadata__", Tensor::zeros({1})), Contains("reserved"));
  CHECK_THAT(save_error("bad\xff", Tensor::zeros({1})), Contains("UTF-8"));
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("Json: values, escaping and exact number round trips", "[io]") {
  io::Json j;
  j["step"] = int64_t(1234567890123);
  j["min"] = std::numeric_limits<int64_t>::min();
  j["seed"] = std::numeric_limits<uint64_t>::max();
  j["lr"] = 0.1;
  j["tiny"] = 5e-324;
  j["text"] = "quote \" backslash \\ newline \n tab \t nul " + std::string(1, '\0') + " ünï 名";
  j["flags"] = io::Json::Array{true, nullptr};
  j["best"]["val/loss"] = 2.5;
  j["diverged"] = std::nan("");
  j["config"] = io::Json::object();
  for (bool pretty : {false, true}) {
    const io::Json back = io::Json::parse(j.dump(pretty));
    CHECK(back.at("step").as_int() == 1234567890123);
    CHECK(back.at("min").as_int() == std::numeric_limits<int64_t>::min());
    CHECK(back.at("seed").as_uint() == std::numeric_limits<uint64_t>::max());
    CHECK(back.at("lr").as_double() == 0.1);
    CHECK(back.at("tiny").as_double() == 5e-324);
    CHECK(back.at("text") == j.at("text"));
    CHECK(std::isnan(back.at("diverged").as_double()));
    CHECK(back.at("best").at("val/loss").as_double() == 2.5);
    CHECK(back.at("flags").size() == 2);
    CHECK(back.at("config").is_object());
  }
  CHECK_THAT(j.dump(), Contains(R"("text":"quote \" backslash \\ newline \n tab \t nul \u0000)"));
  CHECK(io::Json::parse("1").is_int());
  CHECK(io::Json::parse("1.0").kind() == io::Json::Kind::real);
  CHECK(io::Json::parse(R"("\u00fc\ud83d\ude00")").as_string() == "ü😀");

  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const uint64_t bits = rng();
    const double d = std::bit_cast<double>(bits);
    if (!std::isfinite(d)) continue;
    const double back = io::Json::parse(io::Json(d).dump()).as_double();
    REQUIRE(std::memcmp(&back, &d, 8) == 0);
  }
}

TEST_CASE("Json: numbers at the edges parse exactly (found by fuzzing)", "[io]") {
  // rapidjson's full-precision conversion had undefined behaviour on these
  // (tests/fuzz/fuzz_state_json.cpp); numbers are now converted by from_chars.
  auto num = [](const char* text) { return io::Json::parse(text).as_double(); };
  CHECK(num("0e92") == 0.0);
  CHECK(num("0.000e-400") == 0.0);
  CHECK(num("1.5e-400") == 0.0);
  CHECK(std::signbit(num("-1e-400")));
  CHECK(num("4.9406564584124654e-324") == std::numeric_limits<double>::denorm_min());
  CHECK(num("1.7976931348623157e308") == std::numeric_limits<double>::max());
  CHECK(num("0.1") == 0.1);
  CHECK(std::isnan(num("NaN")));
  CHECK(num("-Infinity") == -std::numeric_limits<double>::infinity());
  CHECK(io::Json::parse("-9223372036854775808").as_int() == INT64_MIN);
  CHECK(io::Json::parse("18446744073709551615").as_uint() == UINT64_MAX);
  CHECK(io::Json::parse("18446744073709551616").is_number());  // beyond 64 bits: a double
  CHECK(num("18446744073709551616") == 18446744073709551616.0);
  CHECK_THAT(error_of([] { io::Json::parse("[1e400]", "state.json"); }),
             Contains("state.json") && Contains("too big"));
}

TEST_CASE("Json: parse and access errors", "[io]") {
  CHECK_THAT(error_of([] { io::Json::parse("{\"a\": 1,}", "state.json"); }),
             Contains("state.json") && Contains("byte"));
  CHECK_THAT(error_of([] { io::Json::parse(R"({"a":1,"a":2})"); }), Contains("'a' twice"));
  CHECK_THAT(error_of([] { io::Json::parse(std::string(300, '[') + std::string(300, ']')); }),
             Contains("deeper"));
  CHECK_THAT(error_of([] { io::Json::parse("\"\xff\""); }), Contains("invalid JSON"));
  // A lone surrogate escape parsed once into bytes that dump() then refused
  // (found by fuzzing); now the parser refuses it, so every parsed document dumps.
  CHECK_THAT(error_of([] { io::Json::parse(R"(["\udc00"])", "state.json"); }),
             Contains("state.json") && Contains("lone UTF-16 surrogate"));
  CHECK_THAT(error_of([] { io::Json::parse(R"({"\ude54": 1})"); }), Contains("surrogate"));
  CHECK(io::Json::parse(R"("\ud83d\ude00")").as_string() == "\xf0\x9f\x98\x80");  // a pair is fine
  const io::Json j = io::Json::parse(R"({"a":-1,"s":"x"})");
  CHECK_THAT(error_of([&] { (void)j.at("b"); }), Contains("'b'"));
  CHECK_THAT(error_of([&] { (void)j.at("a").as_uint(); }), Contains("non-negative"));
  CHECK_THAT(error_of([&] { (void)j.at("s").as_int(); }), Contains("got string"));
  CHECK_THAT(error_of([] { (void)io::Json("\xfe").dump(); }), Contains("UTF-8"));
}

// ---- checkpoints ---------------------------------------------------------------

namespace {

ParamTree opt_state_for(int seed) {
  Tensor step = Tensor::empty({}, DType::i64);
  *step.data<int64_t>() = 100 + seed;
  return {{"step", step},
          {"adam.m.h.0.w", make(DType::f32, {3, 4}, seed)},
          {"adam.v.h.0.w", make(DType::f32, {3, 4}, seed + 1)}};
}

ParamTree params_for(int seed) {
  return {{"h.0.w", make(DType::f32, {3, 4}, seed)}, {"h.0.b", make(DType::bf16, {4}, seed)}};
}

std::string state_for(int64_t step) {
  io::Json s;
  s["step"] = step;
  s["epoch"] = 1;
  s["config"]["model"] = "gpt2";
  return s.dump(true);
}

void save_step(const fs::path& workdir, int64_t step) {
  io::save_checkpoint(io::checkpoint_dir(workdir, step), params_for(int(step)),
                      opt_state_for(int(step)), state_for(step));
}

std::vector<int64_t> steps_of(const fs::path& workdir) {
  std::vector<int64_t> out;
  for (const auto& e : io::list_checkpoints(workdir)) out.push_back(e.step);
  return out;
}

}  // namespace

TEST_CASE("checkpoint: save, load, overwrite", "[io]") {
  TempDir work;
  const fs::path dir = io::checkpoint_dir(work.path, 7);
  CHECK(dir == work.path / "ckpt" / "step-000007");
  save_step(work.path, 7);
  io::Checkpoint c = io::load_checkpoint(dir);
  check_same_tree(c.params, params_for(7));
  check_same_tree(c.opt_state, opt_state_for(7));
  CHECK(io::Json::parse(c.state_json).at("step").as_int() == 7);

  // Saving again over the same folder swaps in the new contents, leaving nothing behind.
  io::save_checkpoint(dir, params_for(9), opt_state_for(9), state_for(7));
  check_same_tree(io::load_checkpoint(dir).params, params_for(9));
  CHECK(count_entries(work.path / "ckpt") == 1);

  ParamTree params{{"h.0.w", Tensor::zeros({3, 4})}, {"h.0.b", Tensor::zeros({4}, DType::bf16)}};
  ParamTree opt = opt_state_for(0);
  CHECK(io::load_checkpoint_into(dir, params, opt) == state_for(7));
  check_same_tree(params, params_for(9));
  check_same_tree(opt, opt_state_for(9));

  // Invalid state JSON is refused before anything is written.
  const fs::path other = io::checkpoint_dir(work.path, 8);
  CHECK_THAT(error_of([&] { io::save_checkpoint(other, {}, {}, "{oops"); }),
             Contains("state.json"));
  CHECK(steps_of(work.path) == std::vector<int64_t>{7});
  CHECK(count_entries(work.path / "ckpt") == 1);
}

TEST_CASE("checkpoint: validation names the file", "[io]") {
  TempDir work;
  save_step(work.path, 1);
  const fs::path dir = io::checkpoint_dir(work.path, 1);
  auto load_error = [&] { return error_of([&] { io::load_checkpoint(dir); }); };
  SECTION("missing file") {
    fs::remove(dir / "state.json");
    CHECK_THAT(load_error(), Contains(dir.string()) && Contains("state.json"));
  }
  SECTION("truncated tensor file") {
    const std::string bytes = read_bytes(dir / "opt_state.safetensors");
    write_bytes(dir / "opt_state.safetensors", bytes.substr(0, bytes.size() - 1));
    CHECK_THAT(load_error(), Contains((dir / "opt_state.safetensors").string()));
  }
  SECTION("corrupt state.json") {
    write_bytes(dir / "state.json", "{\"step\": ");
    CHECK_THAT(load_error(), Contains((dir / "state.json").string()));
  }
  SECTION("model mismatch") {
    ParamTree params{{"h.0.w", Tensor::zeros({4, 3})}, {"h.0.b", Tensor::zeros({4}, DType::bf16)}};
    ParamTree opt = opt_state_for(0);
    CHECK_THAT(error_of([&] { io::load_checkpoint_into(dir, params, opt); }),
               Contains("params.safetensors") && Contains("'h.0.w'"));
  }
  SECTION("no checkpoint") {
    CHECK_THAT(error_of([&] { io::load_checkpoint(work.path / "nothing"); }), Contains("nothing"));
  }
}

TEST_CASE("checkpoint: a crash mid-save leaves the previous checkpoint", "[io]") {
  TempDir work;
  CHECK_FALSE(io::load_latest_checkpoint(work.path).has_value());
  save_step(work.path, 100);
  const fs::path ckpt = work.path / "ckpt";
  // What a crash during save_checkpoint(step 200) leaves: a temporary folder
  // with a half-written file; and a hand-made folder with files missing.
  fs::create_directories(ckpt / "step-000200.tmp-0123456789ab");
  const std::string bytes = read_bytes(io::checkpoint_dir(work.path, 100) / "params.safetensors");
  write_bytes(ckpt / "step-000200.tmp-0123456789ab" / "params.safetensors",
              bytes.substr(0, bytes.size() / 2));
  fs::create_directories(ckpt / "step-000300");
  write_bytes(ckpt / "step-000300" / "state.json", "{}");
  fs::create_directories(ckpt / "notes");

  CHECK(steps_of(work.path) == std::vector<int64_t>{100});
  const auto latest = io::load_latest_checkpoint(work.path);
  REQUIRE(latest.has_value());
  check_same_tree(latest->params, params_for(100));
  CHECK(io::Json::parse(latest->state_json).at("step").as_int() == 100);

  SECTION("an interrupted two-rename swap is rolled back") {
    // The fallback publish moved step-100 aside and crashed before the new one arrived.
    fs::rename(io::checkpoint_dir(work.path, 100), ckpt / "step-000100.old-00000000abcd");
    CHECK(steps_of(work.path) == std::vector<int64_t>{100});
    check_same_tree(io::load_checkpoint(io::checkpoint_dir(work.path, 100)).params,
                    params_for(100));
  }
  SECTION("pruning clears the leftovers") {
    save_step(work.path, 400);
    io::prune_checkpoints(work.path, 5);
    CHECK_FALSE(fs::exists(ckpt / "step-000200.tmp-0123456789ab"));
    CHECK(steps_of(work.path) == std::vector<int64_t>{100, 400});
  }
}

TEST_CASE("checkpoint: keep the last k plus protected steps", "[io]") {
  TempDir work;
  for (int64_t step : {10, 20, 30, 40, 50, 1000}) save_step(work.path, step);
  CHECK(io::latest_checkpoint(work.path)->step == 1000);  // by number, not by name
  const auto deleted = io::prune_checkpoints(work.path, 2, {20});
  CHECK(deleted.size() == 3);
  CHECK(steps_of(work.path) == std::vector<int64_t>{20, 50, 1000});
  CHECK(count_entries(work.path / "ckpt") == 3);
  CHECK(io::prune_checkpoints(work.path, 2, {20}).empty());
  CHECK(io::prune_checkpoints(work.path, 1).size() == 2);
  CHECK(steps_of(work.path) == std::vector<int64_t>{1000});
  CHECK_THROWS_AS(io::prune_checkpoints(work.path, 0), Error);
}

// ---- interop with Python's safetensors -------------------------------------------

namespace {

// The repository holding this test: from the source path the compiler saw,
// else upwards from the working directory or the executable (build dirs live
// inside the repository).
fs::path repo_root() {
  std::error_code ec;
  for (fs::path start : {fs::path(__FILE__).parent_path().parent_path(), fs::current_path(),
                         fs::read_symlink("/proc/self/exe", ec).parent_path()}) {
    for (fs::path p = fs::absolute(start, ec); !p.empty(); p = p.parent_path()) {
      if (fs::exists(p / "tests/python/read_safetensors.py", ec)) return p;
      if (p == p.parent_path()) break;
    }
  }
  FAIL("cannot find the redco repository (tests/python/read_safetensors.py) from " << __FILE__);
  return {};
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs tests/python/read_safetensors.py with the venv's Python; returns its
// exit status and output. Without a venv that imports numpy and safetensors
// the test is skipped (exit 77, the [python] cases run as their own Meson
// test, io_python), never passed.
std::pair<int, std::string> run_python(const std::vector<std::string>& args) {
  const fs::path root = repo_root();
  const std::string python = test::python_or_skip(root, "numpy, safetensors");
  std::string cmd =
      quote(python) + " " + quote((root / "tests" / "python" / "read_safetensors.py").string());
  for (const auto& a : args) cmd.append(" ").append(quote(a));
  FILE* pipe = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(pipe);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string expectation(const std::string& name, const Tensor& t) {
  std::string dims;
  for (int64_t d : t.shape()) dims.append(dims.empty() ? "" : ",").append(std::to_string(d));
  return fmt::format("{}|{}|{}|{:.17g}", name, io::safetensors_dtype(t.dtype()), dims, checksum(t));
}

}  // namespace

TEST_CASE("interop: Python's safetensors reads what redco writes", "[io][python]") {
  TempDir dir;
  const ParamTree tree = every_dtype();
  io::save_safetensors(dir / "c.safetensors", tree, {{"format", "pt"}, {"who", "rédco"}});
  std::vector<std::string> args{
      "check", (dir / "c.safetensors").string(), "--meta", "format=pt", "--meta", "who=rédco"};
  for (const auto& [name, t] : tree) args.push_back(expectation(name, t));
  const auto [status, out] = run_python(args);
  INFO(out);
  CHECK(status == 0);
  CHECK_THAT(out, Contains("ok h.0.ln.bias BF16 [5]") && Contains("ok step I64 []"));

  // A wrong expectation must fail, or the check above proves nothing.
  args.back() = expectation("empty.i64", make(DType::i64, {0, 4}));
  CHECK(run_python(args).first != 0);
}

TEST_CASE("interop: redco reads what Python's safetensors writes, byte for byte alike",
          "[io][python]") {
  TempDir dir;
  const auto [status, out] = run_python({"write", (dir / "py.safetensors").string()});
  INFO(out);
  REQUIRE(status == 0);
  io::Metadata meta;
  const ParamTree t = io::load_safetensors(dir / "py.safetensors", &meta);
  CHECK(meta == io::Metadata{{"format", "np"}, {"note", "ünï \"quoted\"\n"}});
  CHECK(t.size() == 8);
  CHECK(t.at("py.f32").shape() == Shape{2, 3});
  CHECK(t.at("py.f32").to_vector() == std::vector<float>{-1, -0.5, 0, 0.5, 1, 1.5});
  CHECK(t.at("py.f16").to_vector() == std::vector<float>{1.5, -2, 65504, 0});
  CHECK(t.at("py.i32").values<int32_t>() == std::vector<int32_t>{-7, 2147483647});
  CHECK(t.at("py.i32").shape() == Shape{2, 1});
  CHECK(t.at("py.i64").values<int64_t>() ==
        std::vector<int64_t>{-(int64_t(1) << 62), (int64_t(1) << 53) + 1, 7});
  const auto u8 = t.at("py.u8").values<uint8_t>();
  CHECK((u8.size() == 256 && u8[0] == 0 && u8[255] == 255));
  CHECK((t.at("py.scalar").rank() == 0 && t.at("py.scalar").item() == 3.25f));
  CHECK(t.at("py.empty").shape() == Shape{0, 4});
  CHECK(t.at("unicodé.名前").values<int32_t>() == std::vector<int32_t>{42});

  // The golden file: Python's writer and redco's produce identical bytes.
  REQUIRE(run_python({"golden", (dir / "golden_py.safetensors").string()}).first == 0);
  const ParamTree golden = io::load_safetensors(dir / "golden_py.safetensors", &meta);
  io::save_safetensors(dir / "golden_redco.safetensors", golden, meta);
  CHECK(read_bytes(dir / "golden_redco.safetensors") == read_bytes(dir / "golden_py.safetensors"));
}
