// The token ids samples/text_to_text trains on, for a reference run in
// another framework (tools/bench/t5_reference.py): the verse pairs of
// SOURCE -> TARGET split by book, encoded by data::Seq2SeqEncoder::with_eos
// with WORKDIR/tokenizer.json (learned as the sample learns it when absent).
// Writes WORKDIR/{train,valid,test}.ids, one pair a line: "src ids | target ids".
//   dump_verse_ids KJV KJV WORKDIR 600 48 Gen,Exod,Josh,Judg Jonah Phlm
#include <fmt/core.h>

#include <fstream>

#include "redco/data/lm_data.hpp"
#include "datasets/verse_pairs.hpp"
#include "redco/redco.hpp"

using namespace redco;

static std::vector<std::string> books(const std::string& s) {
  std::vector<std::string> out;
  for (size_t p = 0; !s.empty();) {
    const size_t q = s.find(',', p);
    out.push_back(s.substr(p, q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  return out;
}

int main(int argc, char** argv) try {
  if (argc != 9) {
    fmt::print(stderr,
               "usage: dump_verse_ids SOURCE TARGET WORKDIR VOCAB MAX_LENGTH TRAIN_BOOKS "
               "VALID_BOOKS TEST_BOOKS (books: OSIS ids, comma-separated; \"\" for all)\n");
    return 2;
  }
  const std::filesystem::path dir = argv[3];
  const data::PairSplit d = data::verse_pairs(
      argv[1], argv[2],
      {.valid_books = books(argv[7]), .test_books = books(argv[8]), .train_books = books(argv[6])});
  std::string text;  // both sides, as the sample learns its BPE
  for (const auto& p : d.train) text += p.source + "\n" + p.target + "\n";
  std::filesystem::create_directories(dir);
  const auto enc = data::Seq2SeqEncoder::with_eos(
      data::load_or_train_bpe(dir / "tokenizer.json", text, std::stoll(argv[4]), true),
      std::stoll(argv[5]));
  fmt::print("vocab {} pad {} eos {} decoder start {}\n", enc.vocab_size(), enc.pad_id(),
             enc.eos_id(), enc.decoder_start());
  for (auto [name, set] : {std::pair{"train", &d.train}, {"valid", &d.valid}, {"test", &d.test}}) {
    std::ofstream f(dir / (std::string(name) + ".ids"));
    const auto s = enc.ids(data::sources(*set)), t = enc.ids(data::targets(*set));
    for (size_t i = 0; i < s.size(); ++i) {
      for (int64_t x : s[i]) f << x << ' ';
      f << '|';
      for (int64_t x : t[i]) f << ' ' << x;
      f << '\n';
    }
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "dump_verse_ids: {}\n", e.what());
  return 1;
}
