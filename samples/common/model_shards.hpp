#pragma once
// --n-model-shards N or auto, and --memory-per-device, as the transformer
// samples take them: auto hands the choice of shards, ZeRO stage, micro-batch
// and recomputation to the planner (DeployerConfig::auto_mesh,
// docs/planning.md).
//
//   sample::ModelShards shards(app);  // adds both flags
//   REDCO_CLI_PARSE(app, argc, argv);
//   shards.plan([&] { return models::hf::Config(dir); }, {.seq_len = 512, .global_batch = 32});
//   train::Deployer deployer({.n_model_shards = shards.count(), .auto_mesh = shards.auto_mesh()});
#include <optional>
#include <string>

#include "redco/core/error.hpp"
#include "redco/models/hf_checkpoint.hpp"
#include "redco/plan/model_shape.hpp"
#include "redco/train/auto_mesh.hpp"
#include "redco_cli.hpp"

namespace redco::sample {

// The shard count, or nullopt for auto.
inline std::optional<int> model_shards(const std::string& text) {
  if (text == "auto") return std::nullopt;
  size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  REDCO_CHECK(used == text.size() && used > 0 && n >= 1,
              "--n-model-shards '{}': give a number >= 1, or auto", text);
  return n;
}

class ModelShards {
 public:
  explicit ModelShards(cli::App& app) {
    app.add_option("--n-model-shards", text_,
                   "a number, or auto: the planner picks the shards, ZeRO stage and "
                   "recomputation that fit (docs/planning.md)")
        ->check(cli::at_least_or(1, "auto"));
    app.add_option("--memory-per-device", memory_,
                   "what each rank may use (16GB), planned for or checked before the "
                   "first step; default under auto: the host's available memory shared "
                   "by its ranks");
  }
  ModelShards(const ModelShards&) = delete;  // the flags point into it
  ModelShards& operator=(const ModelShards&) = delete;

  // What the planner plans for under auto, or checks a given shard count
  // against when --memory-per-device is given (a cut that does not fit stops
  // before the first step, with its breakdown): the model (`config()` is
  // called only then: the folder's config.json, or the one a sample builds)
  // and the run.
  template <typename ConfigFn>
  void plan(ConfigFn&& config, train::AutoMeshOptions run) {
    const std::optional<int> given = model_shards(text_);
    if (given && memory_.empty()) return;
    if (!memory_.empty()) run.memory_per_device = plan::parse_size(memory_, "--memory-per-device");
    run.n_model_shards = given;
    mesh_ = train::AutoMesh{plan::model_shape(config()), run};
  }
  // The same for a sample that fine-tunes the folder `init_from` when one is
  // given and else builds its model from flags: `built()` is the config.json
  // of the model it would build (called only when there is one to plan).
  template <typename BuiltFn>
  void plan(const std::string& init_from, BuiltFn&& built, train::AutoMeshOptions run) {
    plan(
        [&] {
          return init_from.empty() ? models::hf::Config(built(), "the model flags (--dim ...)")
                                   : models::hf::Config(init_from);
        },
        run);
  }
  // DeployerConfig's n_model_shards (under auto: replaced by the planner's) and auto_mesh.
  int count() const { return model_shards(text_).value_or(1); }
  const train::AutoMesh* auto_mesh() const { return mesh_ ? &*mesh_ : nullptr; }

 private:
  std::string text_ = "1", memory_;
  std::optional<train::AutoMesh> mesh_;
};

}  // namespace redco::sample
