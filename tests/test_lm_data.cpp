// Language-model data (redco/data/lm_data.hpp): load-or-train of the
// tokenizer, token windows, the shifted batch, the unigram entropy.
#include <fmt/core.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "redco/core/error.hpp"
#include "redco/data/bpe.hpp"
#include "redco/data/lm_data.hpp"

using namespace redco;
namespace fs = std::filesystem;

namespace {

// A folder of this process's own, removed at the end of the test.
struct TempDir {
  fs::path path = fs::temp_directory_path() / fmt::format("redco-lm-data-{}", ::getpid());
  TempDir() { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
};

const char* const kText =
    "In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face "
    "of the waters. And God said, Let there be light: and there was light. And God saw the light, "
    "that it was good: and God divided the light from the darkness.\n";

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t(100));
  return v;
}

}  // namespace

TEST_CASE("token windows cover the stream", "[lm_data]") {
  const std::vector<int64_t> tokens = iota(23);  // 100, 101, ..., 122
  const auto ws = data::token_windows(tokens, 4);
  // Starts 0, 4, ..., 16: a window of 5 from 20 would end past the stream.
  REQUIRE(ws.size() == 5);
  for (size_t i = 0; i < ws.size(); ++i) {
    REQUIRE(ws[i].size() == 5);
    CHECK(ws[i].data() == tokens.data() + 4 * i);  // views, not copies
    // Each window's inputs start where the previous one's ended: every token
    // up to the last whole window is an input exactly once.
    for (size_t k = 0; k < 5; ++k) CHECK(ws[i][k] == tokens[4 * i + k]);
  }
  CHECK(ws.back().back() == tokens[20]);
  // A stream that ends exactly on a window boundary loses nothing.
  CHECK(data::token_windows(std::span(tokens).first(21), 4).size() == 5);
  CHECK(data::token_windows(std::span(tokens).first(5), 4).size() == 1);
  CHECK(data::token_windows(std::span(tokens).first(4), 4).empty());
  // Stride 1: every start position.
  const auto all = data::token_windows(tokens, 4, 1);
  REQUIRE(all.size() == 19);
  CHECK(all[18].front() == tokens[18]);
  CHECK_THROWS_AS(data::token_windows(tokens, 0), Error);
}

TEST_CASE("the shifted batch: targets are the inputs moved by one", "[lm_data]") {
  const std::vector<int64_t> tokens = iota(40);
  const auto ws = data::token_windows(tokens, 6, 5);  // overlapping windows
  const data::LmBatch b = data::shifted_batch(ws);
  const auto B = int64_t(ws.size()), T = int64_t(6);
  REQUIRE(b.inputs.shape() == Shape{B, T});
  REQUIRE(b.targets.shape() == Shape{B, T});
  REQUIRE(b.inputs.dtype() == DType::i64);
  const int64_t* in = b.inputs.data<int64_t>();
  const int64_t* tg = b.targets.data<int64_t>();
  for (int64_t i = 0; i < B; ++i) {
    for (int64_t t = 0; t < T; ++t) {
      CHECK(in[i * T + t] == ws[size_t(i)][size_t(t)]);
      CHECK(tg[i * T + t] == ws[size_t(i)][size_t(t + 1)]);
      if (t + 1 < T) CHECK(tg[i * T + t] == in[i * T + t + 1]);
    }
  }
  // Windows of different lengths cannot share a batch.
  const std::vector<data::TokenWindow> mixed{ws[0], ws[1].first(4)};
  CHECK_THROWS_AS(data::shifted_batch(mixed), Error);
  CHECK_THROWS_AS(data::shifted_batch({}), Error);
}

TEST_CASE("load_or_train_bpe trains, saves, then reuses the saved tokenizer", "[lm_data]") {
  TempDir dir;
  const fs::path file = dir.path / "tok" / "tokenizer.json";
  const std::string probe = "And God said, Let the waters be gathered together";
  const data::Tokenizer first = data::load_or_train_bpe(file, kText, 300);
  REQUIRE(fs::exists(file));
  REQUIRE(first.vocab_size() == 300);
  const std::vector<int64_t> ids = data::token_ids(first, probe);
  // The Hugging Face path gives the trainer's own ids.
  const std::vector<int32_t> bpe_ids = data::Bpe::train(kText, 300).encode(probe);
  CHECK(ids == std::vector<int64_t>(bpe_ids.begin(), bpe_ids.end()));
  CHECK(ids.size() < probe.size());  // merges were learned and used
  CHECK(first.decode(ids) == probe);

  // Another text: had it been trained on, the ids would differ, so equal ids
  // and an untouched file show that the saved tokenizer was reused.
  const auto written = fs::last_write_time(file);
  const data::Tokenizer again = data::load_or_train_bpe(file, "zzzz yyyy zzzz yyyy", 300);
  CHECK(data::token_ids(again, probe) == ids);
  CHECK(fs::last_write_time(file) == written);
  CHECK(data::token_ids(data::Tokenizer::from_file(file), probe) == ids);
  // No temporary file is left behind.
  CHECK(std::distance(fs::directory_iterator(file.parent_path()), fs::directory_iterator()) == 1);

  // A different vocabulary size is learned anew and replaces the file.
  const data::Tokenizer smaller = data::load_or_train_bpe(file, kText, 280);
  CHECK(smaller.vocab_size() == 280);
  CHECK(data::Tokenizer::from_file(file).vocab_size() == 280);

  // save = false writes nothing.
  const fs::path other = dir.path / "unsaved.json";
  CHECK(data::load_or_train_bpe(other, kText, 300, false).vocab_size() == 300);
  CHECK_FALSE(fs::exists(other));
  CHECK_THROWS_AS(data::load_or_train_bpe(other, kText, 100), Error);
}

TEST_CASE("pick_tokenizer: the named file, else the checkpoint's own, else the learned one",
          "[lm_data]") {
  TempDir dir;
  const fs::path learned = dir.path / "work" / "tokenizer.json";
  const fs::path ckpt = dir.path / "ckpt", named = dir.path / "named.json";
  const data::TokenizerFile l = data::pick_tokenizer({}, {}, learned, kText, 300);
  CHECK(l.file == learned);
  CHECK(l.tok.vocab_size() == 300);
  data::load_or_train_bpe(ckpt / "tokenizer.json", kText, 290);
  const data::TokenizerFile c = data::pick_tokenizer({}, ckpt, learned, kText, 300);
  CHECK(c.file == ckpt / "tokenizer.json");
  CHECK(c.tok.vocab_size() == 290);  // the checkpoint's vocabulary, not --vocab
  data::load_or_train_bpe(named, kText, 270);
  const data::TokenizerFile n = data::pick_tokenizer(named, ckpt, learned, kText, 300);
  CHECK(n.file == named);
  CHECK(n.tok.vocab_size() == 270);
  // A checkpoint without a tokenizer.json is an error that says what to pass.
  fs::create_directories(dir.path / "bare");
  try {
    data::pick_tokenizer({}, dir.path / "bare", learned, kText, 300);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(),
               Catch::Contains("has no tokenizer.json") && Catch::Contains("--tokenizer"));
  }
}

TEST_CASE("unigram entropy", "[lm_data]") {
  const std::vector<int64_t> uniform{3, 1, 4, 2, 1, 3, 2, 4};
  CHECK(data::unigram_entropy(uniform) == Approx(std::log(4.0)));
  const std::vector<int64_t> one{7, 7, 7};
  CHECK(data::unigram_entropy(one) == 0.0);
  const std::vector<int64_t> skewed{0, 0, 1};
  CHECK(data::unigram_entropy(skewed) ==
        Approx(-(2.0 / 3 * std::log(2.0 / 3) + 1.0 / 3 * std::log(1.0 / 3))));
}
