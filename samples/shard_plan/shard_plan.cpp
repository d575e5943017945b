// Prints how GPT-2 (124M) splits across model shards: the plan is computed
// from the model's type at compile time and applied to its sizes at run time.
//   build/samples/shard_plan/shard_plan --shards 2
#include <fmt/core.h>

#include "redco/redco.hpp"
#include "redco_cli.hpp"

using namespace redco;

auto gpt2(int64_t vocab, int64_t ctx, int64_t d, int64_t heads, int64_t layers) {
  return (nn::embedding(vocab, d) + nn::positions(ctx, d)) |
         nn::repeat(layers, nn::residual(nn::layer_norm(d) | nn::causal_attention(d, heads)) |
                                nn::residual(nn::layer_norm(d) | nn::mlp(d, 4 * d))) |
         nn::named<"ln_f">(nn::layer_norm(d)) | nn::tied_lm_head(vocab);
}

// Known before the program runs: the compiler checked these.
constexpr auto plan = shard::plan_v<decltype(gpt2(0, 0, 0, 1, 0))>;
static_assert(plan.split("h.*.attn.q_proj.weight") == 0 &&
              plan.split("h.*.attn.o_proj.weight") == 1);
static_assert(plan.split("h.*.mlp.fc1.weight") == 0 && plan.split("h.*.mlp.fc2.weight") == 1);

int main(int argc, char** argv) try {
  cli::App app{"Show GPT-2's tensor-parallel shard plan"};
  int shards = 2;
  int64_t vocab = 50257, layers = 12;
  std::string from;
  app.add_option("--shards", shards, "number of model shards")->check(redco::cli::at_least(1));
  app.add_option("--from", from, "a Hugging Face checkpoint folder: its model's plan instead");
  app.add_option("--vocab", vocab, "vocabulary size (50304 divides by 2..128)");
  app.add_option("--layers", layers);
  REDCO_CLI_PARSE(app, argc, argv);
  if (!from.empty()) {  // any supported checkpoint, from its config.json
    fmt::print("{} over {} model shards\n\n{}", from, shards,
               shard::describe(models::checkpoint_plan(from, shards), shards));
    return 0;
  }

  const auto model = gpt2(vocab, 1024, 768, 12, layers);
  fmt::print("GPT-2 with {} layers, vocabulary {}, over {} model shards\n\n", layers, vocab,
             shards);
  fmt::print("{}\n", shard::describe(shard::resolve(model, shards), shards));
  fmt::print("collectives (per layer for h.*):\n{}", shard::describe_collectives(plan));
} catch (const std::exception& e) {
  fmt::print(stderr, "shard_plan: {}\n", e.what());
  return 1;
}
