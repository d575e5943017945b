// data::Tokenizer against the live `tokenizers` package on every verse of
// the KJV: ids, character offsets and both decodes, for each committed
// tokenizer kind. Exits 77 (Meson's SKIP) without the repository's .venv
// (tools/setup test makes it) or without the bible-kjv package.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include "redco/data/bpe.hpp"
#include "redco/data/text.hpp"
#include "tokenizer_goldens.hpp"

using namespace redco;
namespace fs = std::filesystem;

namespace {

constexpr int kSkip = 77;

struct Reader {
  std::string bytes;
  size_t at = 0;
  int32_t i32() {
    if (at + 4 > bytes.size()) throw Error("tokenizer_reference.py output is truncated");
    int32_t v;
    std::memcpy(&v, bytes.data() + at, 4);
    at += 4;
    return v;
  }
  std::string str() {
    const size_t n = size_t(i32());
    std::string s = bytes.substr(at, n);
    at += n;
    return s;
  }
};

// Compares one tokenizer.json; returns the number of verses that differ. With
// `bpe`, the package must also give that trainer's own encode() ids.
size_t compare(const std::string& kind, const fs::path& json,
               const std::vector<std::string>& verses, const fs::path& python, const fs::path& work,
               const data::Bpe* bpe = nullptr) {
  const fs::path in = work / "kjv.txt", out = work / (kind + ".bin");
  {
    std::ofstream f(in, std::ios::binary);
    for (size_t i = 0; i < verses.size(); ++i) f << (i ? "\n" : "") << verses[i];
  }
  const std::string cmd =
      "'" + python.string() + "' '" +
      (tokenizer_test::repo_root() / "tests/python/tokenizer_reference.py").string() + "' '" +
      json.string() + "' '" + in.string() + "' '" + out.string() + "'";
  if (std::system(cmd.c_str()) != 0) throw Error("failed: " + cmd);
  Reader r;
  {
    std::ifstream f(out, std::ios::binary);
    r.bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  const auto tok = data::Tokenizer::from_file(json);
  const auto encs = tok.encode_batch(std::span<const std::string>(verses), true, 1);
  size_t bad = 0;
  for (size_t v = 0; v < verses.size(); ++v) {
    const size_t n = size_t(r.i32());
    std::vector<int32_t> ids(n);
    std::vector<std::pair<uint32_t, uint32_t>> offsets(n);
    for (auto& id : ids) id = r.i32();
    for (auto& o : offsets) o.first = uint32_t(r.i32()), o.second = uint32_t(r.i32());
    const std::string d = r.str(), ds = r.str();
    const data::Encoding e = encs[v].to_encoding();
    const bool ok = e.ids == ids && (!bpe || bpe->encode(verses[v]) == ids) &&
                    tokenizer_test::char_offsets(verses[v], e.offsets) == offsets &&
                    tok.decode(ids) == d && tok.decode(ids, true) == ds;
    if (!ok && bad++ < 3) std::cerr << kind << ": verse " << v << " differs: " << verses[v] << "\n";
  }
  std::cout << kind << ": " << verses.size() << " verses, " << bad << " differ\n";
  return bad;
}

}  // namespace

int main() {
  try {
    const char* env = std::getenv("REDCO_VENV");
    const fs::path venv = env && *env ? fs::path(env) : tokenizer_test::repo_root() / ".venv";
    const fs::path python = venv / "bin" / "python";
    if (!fs::exists(python) ||
        std::system(("'" + python.string() + "' -c 'import tokenizers' 2>/dev/null").c_str()) !=
            0) {
      std::cout << "SKIP: no Python with `tokenizers` at " << venv << " (run tools/setup test)\n";
      return kSkip;
    }
    std::vector<std::string> verses;
    try {
      for (auto& v : data::read_kjv()) verses.push_back(std::move(v.text));
    } catch (const Error& e) {
      std::cout << "SKIP: " << e.what() << "\n";
      return kSkip;
    }
    const fs::path work =
        fs::temp_directory_path() / ("redco_tokenizer_kjv_" + std::to_string(getpid()));
    fs::create_directories(work);
    size_t bad = 0;
    for (const char* kind : {"gpt2", "llama3", "roberta", "bert", "llama2", "t5", "misc"})
      bad += compare(kind, tokenizer_test::fixture(kind) / "tokenizer.json", verses, python, work);
    // redco's own BPE trainer, written as a tokenizer.json.
    std::string corpus;
    for (size_t i = 0; i < verses.size() && corpus.size() < 400000; ++i) corpus += verses[i] + "\n";
    const data::Bpe bpe = data::Bpe::train(corpus, 700);
    bpe.save_tokenizer_json(work / "redco_bpe.json");
    bad += compare("redco Bpe", work / "redco_bpe.json", verses, python, work, &bpe);
    fs::remove_all(work);
    return bad == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "test_tokenizer_kjv: " << e.what() << "\n";
    return 1;
  }
}
