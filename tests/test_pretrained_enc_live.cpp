// Live round trip with transformers: redco loads each encoder-decoder and
// encoder fixture, changes every parameter (p * 1.02 + 0.001), computes logits,
// saves the checkpoint with save_pretrained, and tests/python/
// check_hf_roundtrip.py loads it with transformers (every tensor must load)
// and must reproduce redco's logits within 1e-4 (or 2e-5 relative to the
// largest logit). Exits 77 (Meson: SKIP)
// without a Python that has transformers (.venv or $REDCO_VENV).
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "redco/io/safetensors.hpp"
#include "redco/models/pretrained.hpp"

using namespace redco;
namespace fs = std::filesystem;

namespace {

fs::path root() {
  const char* r = std::getenv("REDCO_ROOT");
  return r ? fs::path(r) : fs::path(__FILE__).parent_path().parent_path();
}

// Saves the changed model and redco's logits into `dir` for the check.
template <typename M>
void save_changed(const std::string& name, const fs::path& dir) {
  auto p = models::from_pretrained<M>(root() / "tests/fixtures/hf" / name);
  for (auto& [k, t] : p.params) t = add(mul(t, 1.02f), 0.001f);
  const nn::ParamTree g =
      io::load_safetensors(root() / "tests/fixtures/hf" / name / "golden.safetensors");
  nn::ParamTree out;
  NoGradGuard no_grad;
  nn::Ctx ctx;
  if (g.count("decoder_input_ids")) {
    ctx.source = g.at("input_ids");
    ctx.source_mask = g.at("attention_mask");
    out["logits"] = nn::apply(p.model, p.params, g.at("decoder_input_ids"), ctx);
    for (const char* k : {"input_ids", "attention_mask", "decoder_input_ids"}) out[k] = g.at(k);
  } else {
    ctx.token_types = g.at("token_type_ids");
    out["logits"] = nn::apply(p.model, p.params, g.at("input_ids"), ctx);
    for (const char* k : {"input_ids", "token_type_ids"}) out[k] = g.at(k);
  }
  fs::remove_all(dir);
  models::save_pretrained(dir, p);
  io::save_safetensors(dir / "redco_outputs.safetensors", out, {{"format", "pt"}});
}

}  // namespace

int main() {
  const char* env = std::getenv("REDCO_VENV");
  const fs::path python = (env && *env ? fs::path(env) : root() / ".venv") / "bin" / "python";
  // Appended piecewise: GCC 12 reports a false -Wrestrict on "'" + std::string.
  std::string probe = "'";
  probe += python.string();
  probe += "' -c 'import transformers' 2>/dev/null";
  if (!fs::exists(python) || std::system(probe.c_str()) != 0) {
    fmt::print("SKIP: no Python with transformers at {} (tools/setup test makes .venv)\n",
               python.string());
    return 77;
  }
  const fs::path tmp = fs::temp_directory_path() / fmt::format("redco-hf-live-{}", ::getpid());
  save_changed<models::T5>("t5", tmp / "t5");
  save_changed<models::T5>("flan_t5", tmp / "flan_t5");
  save_changed<models::Bart>("bart", tmp / "bart");
  save_changed<models::Bert>("bert", tmp / "bert");
  save_changed<models::Roberta>("roberta", tmp / "roberta");
  std::string cmd = fmt::format("'{}' '{}'", python.string(),
                                (root() / "tests/python/check_hf_roundtrip.py").string());
  for (const char* name : {"t5", "flan_t5", "bart", "bert", "roberta"})
    cmd += fmt::format(" '{}'", (tmp / name).string());
  const int rc = std::system(cmd.c_str());
  fs::remove_all(tmp);
  const bool ok = WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
  if (!ok) fmt::print("FAIL: {}\n", cmd);
  return ok ? 0 : 1;
}
