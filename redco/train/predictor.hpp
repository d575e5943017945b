#pragma once
// Prediction over a list of examples, in batches, with outputs in input order.
//
//   auto predict = [](auto& model, const Batch& b, Rng) {
//     return argmax(model(b.x), 1).values<int64_t>();  // one output per example
//   };
//   Predictor predictor(deployer, model, collate, predict);            // outputs as they are
//   Predictor named(deployer, model, collate, predict, to_label_name);  // output(Out) -> Value
//   std::vector<int64_t> labels = predictor.predict(test, 64, trainer.params());
//
// Every example is predicted exactly once: the last batch holds the
// remainder (it is smaller, not padded or dropped). The model runs in
// evaluation mode (no dropout, no autograd history); batch b sees
// Rng{seed, b, Purpose::predict}, so sampling is reproducible.
//
// On a mesh, predict() is collective: the data-parallel replicas split every
// batch (replica r's slice of batch b sees Rng{seed, b * dp_size + r}), the
// ranks of a model-parallel group share theirs, and every rank gets all the
// outputs back in input order. Outputs cross processes serialised with
// cereal, so with more than one replica the value type must be serialisable
// (standard containers, strings and arithmetic types are; a user type needs
// a serialize() member, see cereal's documentation). Parameters may be this
// rank's shards (Trainer::params()) or whole tensors, which are sliced.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "redco/comm/mesh.hpp"
#include "redco/core/error.hpp"
#include "redco/nn/shard_plan.hpp"
#include "redco/train/concepts.hpp"
#include "redco/train/deployer.hpp"
#include "redco/train/gather_outputs.hpp"
#include "redco/train/on_device.hpp"
#include "redco/train/parallel.hpp"
#include "redco/train/pipeline.hpp"

namespace redco::train {

template <nn::Layer L, typename Collate, typename Predict, typename Output = Identity>
class Predictor {
 public:
  Predictor(const Deployer& deployer, L model, Collate collate, Predict predict, Output output = {})
      : deployer_(&deployer),
        model_(std::move(model)),
        collate_(std::move(collate)),
        predict_(std::move(predict)),
        output_(std::move(output)) {}

  // True when the functions fit examples of type Ex; check<Ex>() says why not
  // with one static_assert message per function.
  template <typename Ex>
  static constexpr bool accepts() {
    if constexpr (!CollateFn<Collate, Ex>) {
      return false;
    } else if constexpr (!PredictFn<Predict, BoundModel<L>, batch_t<Collate, Ex>>) {
      return false;
    } else {
      return OutputFn<Output, prediction_t<Predict, BoundModel<L>, batch_t<Collate, Ex>>>;
    }
  }
  template <typename Ex>
  static constexpr bool check() {
    static_assert(CollateFn<Collate, Ex>, REDCO_COLLATE_MESSAGE);
    if constexpr (CollateFn<Collate, Ex>) {
      static_assert(PredictFn<Predict, BoundModel<L>, batch_t<Collate, Ex>>, REDCO_PREDICT_MESSAGE);
      if constexpr (PredictFn<Predict, BoundModel<L>, batch_t<Collate, Ex>>) {
        static_assert(OutputFn<Output, prediction_t<Predict, BoundModel<L>, batch_t<Collate, Ex>>>,
                      REDCO_OUTPUT_MESSAGE);
      }
    }
    return accepts<Ex>();
  }
  // What predict() returns one of per example (valid when accepts<Ex>()).
  template <typename Ex>
  using value_type = output_t<Output, prediction_t<Predict, BoundModel<L>, batch_t<Collate, Ex>>>;

  // One value per example, in input order.
  template <typename R>
  auto predict(const R& examples, int64_t per_device_batch_size, const ParamTree& params) const {
    static_assert(ExampleRange<R>, REDCO_EXAMPLES_MESSAGE);
    if constexpr (ExampleRange<R>) {
      if constexpr (check<example_t<R>>()) return run(examples, per_device_batch_size, params);
    }
  }
  // With the parameters given to set_params() (a served model, a loaded checkpoint).
  template <typename R>
  auto predict(const R& examples, int64_t per_device_batch_size) const {
    REDCO_CHECK(params_.has_value(),
                "Predictor::predict: no parameters; pass them or call set_params() first");
    return predict(examples, per_device_batch_size, *params_);
  }
  void set_params(ParamTree params) { params_ = std::move(params); }

  const L& model() const { return model_; }
  const Deployer& deployer() const { return *deployer_; }

 private:
  template <typename R>
  auto run(const R& examples, int64_t per_device_batch_size, const ParamTree& params) const {
    using Ex = example_t<R>;
    using Batch = batch_t<Collate, Ex>;
    using Value = value_type<Ex>;
    REDCO_CHECK(per_device_batch_size > 0,
                "Predictor::predict: per_device_batch_size must be > 0, got {}",
                per_device_batch_size);
    // On the run's device (the Trainer's parameters are there already; a
    // tree read from a checkpoint on the host moves once per call).
    const ParamTree local = deployer_->place(local_params(params, local_));
    const int64_t n = int64_t(std::ranges::size(examples));
    const detail::Slices slices(n, per_device_batch_size, deployer_->dp_size(),
                                deployer_->dp_rank());
    comm::Comm* mp = deployer_->n_model_shards() > 1 ? &deployer_->mesh().mp_comm() : nullptr;
    std::vector<Value> out;
    out.reserve(size_t(n));
    NoGradGuard no_grad;
    auto make = [&](int64_t b) {
      return on_device(collate_(std::span<const Ex>(
                           detail::gather_range(examples, slices.begin(b), slices.size(b)))),
                       deployer_->device());
    };
    auto use = [&](int64_t b, const Batch& x) {
      const auto id = uint64_t(slices.id(b));
      BoundModel<L> bound(model_, local,
                          nn::Ctx{.train = false, .seed = deployer_->seed(), .step = id, .mp = mp});
      auto preds = predict_(bound, x, deployer_->rng(Purpose::predict, id));
      REDCO_CHECK(int64_t(std::ranges::size(preds)) == slices.size(b),
                  "predict returned {} outputs for a batch of {} examples; it must return one per "
                  "example",
                  std::ranges::size(preds), slices.size(b));
      for (auto&& p : preds) out.push_back(output_(std::move(p)));
      return true;
    };
    detail::pipelined<Batch>(slices.count(), make, use);
    if (deployer_->dp_size() == 1) return out;
    return detail::gather_outputs(std::move(out), slices, deployer_->mesh().dp_comm());
  }

  // `params` as this rank's shards: used as they are when they already are
  // (the Trainer's params()), sliced into `scratch` when whole (a loaded
  // checkpoint, an imported model).
  const ParamTree& local_params(const ParamTree& params, ParamTree& scratch) const {
    const int mp = deployer_->n_model_shards();
    if (mp == 1) {
      nn::check_params(nn::param_entries(model_), params);
      return params;
    }
    const ShardPlan plan = shard::resolve(model_, mp);
    bool whole = true, sharded = true;
    for (const shard::ParamSplit& s : plan) {
      const auto it = params.find(s.name);
      REDCO_CHECK(it != params.end(), "Predictor: parameter '{}' is missing", s.name);
      whole = whole && it->second.shape() == s.shape;
      sharded = sharded && it->second.shape() == shard::shard_shape(s, mp);
    }
    if (sharded) return params;
    nn::check_params(nn::param_entries(model_), params);  // names the first misfit
    scratch = shard_params(params, plan, deployer_->mp_rank(), mp);
    return scratch;
  }

  const Deployer* deployer_;
  L model_;
  // Mutable so stateful (mutable) lambdas work; each is called from one
  // thread at a time, collate on the pool while predict runs here.
  mutable Collate collate_;
  mutable Predict predict_;
  mutable Output output_;
  std::optional<ParamTree> params_;
  mutable ParamTree local_;  // this rank's slices of whole parameters given to predict()
};

}  // namespace redco::train
