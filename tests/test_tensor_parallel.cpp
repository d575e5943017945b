// Tensor parallelism through the ordinary nn::apply, for every kind of DSL
// model, on the threads backend: with mp ranks each holding its shards, the
// loss must equal the single-rank loss and each rank's gradient the slice of
// the single-rank gradient (dropout on, in training mode). Plus placements:
// cross_entropy on vocabulary-split logits, whole() and the error raised when
// a split tensor is read as a whole one.
// Catch2's assertions are not thread-safe, so ranks store what they computed
// and the checks run on the test's thread after ThreadsWorld::run returns.
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.hpp"
#include "redco/autodiff/value_and_grad.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/models/bart.hpp"
#include "redco/models/bert.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/models/gpt_neox.hpp"
#include "redco/models/gptj.hpp"
#include "redco/models/llama.hpp"
#include "redco/models/opt.hpp"
#include "redco/models/t5.hpp"
#include "redco/models/vision.hpp"
#include "redco/train/parallel.hpp"

using namespace redco;

namespace {

Tensor randn(const Shape& s, uint64_t stream) { return Tensor::normal(s, 7, stream, 0.f, 1.f); }

Tensor tokens(int64_t rows, int64_t len, int64_t vocab, uint64_t stream) {
  std::vector<int64_t> ids(size_t(rows * len));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(philox_bits(3, stream, i) % vocab);
  return Tensor::from<int64_t>(std::span<const int64_t>(ids), Shape{rows, len});
}

// Labels with every fifth one ignored, so ignore_index is exercised too.
Tensor labels_of(int64_t rows, int64_t len, int64_t classes, uint64_t stream) {
  Tensor t = tokens(rows, len, classes, stream);
  int64_t* l = t.data<int64_t>();
  for (int64_t i = 0; i < t.numel(); i += 5) l[i] = -100;
  return t;
}

float max_abs(const Tensor& t) {
  float m = 0.f;
  for (float v : t.to_vector()) m = std::max(m, std::abs(v));
  return m;
}

using test::max_abs_diff;

// Close to 1e-5 relative to the tensor's largest entry.
bool close(const Tensor& got, const Tensor& want) {
  return max_abs_diff(got, want) <= 1e-5f * std::max(max_abs(want), 1e-3f);
}

struct Run {
  float loss = 0.f;
  ParamTree grads;
  bool split_output = false;  // the model output carried a placement
};

// What a test computes from the model: (params, ctx, the model output) -> loss.
using LossFn = std::function<Tensor(const ParamTree&, nn::Ctx&, Tensor&)>;

nn::Ctx training_ctx() { return {.train = true, .seed = 3, .step = 2}; }

Run one_rank(const ParamTree& params, const LossFn& loss_of) {
  Run run;
  Tensor out;
  auto [loss, grads] = value_and_grad(
      [&](const ParamTree& p) {
        nn::Ctx ctx = training_ctx();
        return loss_of(p, ctx, out);
      },
      params);
  return {loss.item(), std::move(grads), out.placement() != nullptr};
}

// Every rank's run on its shards of the same initialisation.
template <typename M>
std::vector<Run> mp_ranks(const M& model, int mp, const LossFn& loss_of) {
  const auto plan = shard::resolve(model, mp);
  std::vector<Run> runs(static_cast<size_t>(mp));
  comm::ThreadsWorld(mp).run([&](comm::Comm& comm) {
    const ParamTree shard = train::init_shard(nn::param_entries(model), plan, 5, comm.rank(), mp);
    Tensor out;
    auto [loss, grads] = value_and_grad(
        [&](const ParamTree& p) {
          nn::Ctx ctx = training_ctx();
          ctx.mp = &comm;
          return loss_of(p, ctx, out);
        },
        shard);
    runs[size_t(comm.rank())] = {loss.item(), std::move(grads), out.placement() != nullptr};
  });
  return runs;
}

// The mp-rank runs against the one-rank run; returns how many parameters the
// plan split (so a test can insist that something was split).
template <typename M>
size_t check_against_one_rank(const M& model, int mp, const LossFn& loss_of,
                              bool expect_split_output) {
  const Run want = one_rank(nn::init_params(model, 5), loss_of);
  REQUIRE(std::isfinite(want.loss));
  const auto plan = shard::resolve(model, mp);
  const std::vector<Run> got = mp_ranks(model, mp, loss_of);
  size_t split = 0;
  for (int r = 0; r < mp; ++r) {
    INFO("mp " << mp << ", rank " << r);
    const Run& g = got[size_t(r)];
    CHECK(std::abs(g.loss - want.loss) <= 1e-5f * std::abs(want.loss));
    CHECK(g.split_output == expect_split_output);
    REQUIRE(g.grads.size() == plan.size());
    for (const shard::ParamSplit& s : plan) {
      INFO(s.name << " split dim " << s.split_dim);
      const Tensor slice = train::slice_shard(want.grads.at(s.name), s, r, mp);
      CHECK(close(g.grads.at(s.name), slice));
    }
  }
  for (const shard::ParamSplit& s : plan) split += s.split_dim >= 0;
  return split;
}

models::Gpt2Config tiny_gpt() {
  return {.vocab = 16, .context = 8, .dim = 16, .layers = 2, .heads = 4, .dropout = 0.1f};
}

}  // namespace

TEST_CASE("tensor-parallel GPT-2 with dropout matches one rank", "[tensor_parallel]") {
  const auto model = models::gpt2(tiny_gpt());
  const Tensor ids = tokens(2, 8, 16, 1), labels = labels_of(2, 8, 16, 2);
  const LossFn loss = [&](const ParamTree& p, nn::Ctx& ctx, Tensor& out) {
    out = nn::apply(model, p, ids, ctx);
    return cross_entropy(out, labels);
  };
  for (int mp : {2, 4}) CHECK(check_against_one_rank(model, mp, loss, true) == 1 + 2 * 10);
}

TEST_CASE("tensor-parallel LLaMA (GQA, rotary, gated MLP, untied head) matches one rank",
          "[tensor_parallel]") {
  const auto model =
      models::llama({.vocab = 16, .dim = 16, .layers = 2, .heads = 4, .kv_heads = 2, .hidden = 24});
  const Tensor ids = tokens(2, 6, 16, 3), labels = labels_of(2, 6, 16, 4);
  const LossFn loss = [&](const ParamTree& p, nn::Ctx& ctx, Tensor& out) {
    out = nn::apply(model, p, ids, ctx);
    return cross_entropy(out, labels);
  };
  // Everything split but the norms: embedding, q k v o, gate up down, head.
  CHECK(check_against_one_rank(model, 2, loss, true) == 1 + 2 * 7 + 1);
  // 2 kv heads do not divide into 4 shards: resolve replicates attention, and
  // only the embedding, the MLPs and the head are split.
  const auto plan = shard::resolve(model, 4);
  for (const auto& s : plan)
    if (s.name.find("self_attn") != std::string::npos) CHECK(s.split_dim == -1);
  CHECK(check_against_one_rank(model, 4, loss, true) == 1 + 2 * 3 + 1);
}

TEST_CASE(
    "tensor-parallel T5 (relative bias split by heads, cross-attention, padded source) matches "
    "one rank",
    "[tensor_parallel]") {
  models::T5Config c{.vocab = 16,
                     .dim = 16,
                     .heads = 4,
                     .hidden = 32,
                     .encoder_layers = 1,
                     .decoder_layers = 2,
                     .head_dim = 6,
                     .buckets = 8,
                     .max_distance = 12,
                     .dropout = 0.1f};
  const Tensor source = tokens(2, 7, 16, 5), target = tokens(2, 5, 16, 6);
  const Tensor labels = labels_of(2, 5, 16, 7);
  Tensor mask = Tensor::ones({2, 7});
  mask.data<float>()[5] = mask.data<float>()[6] = 0.f;  // row 0 right-padded
  {
    const auto model = models::t5(c);
    const LossFn loss = [&](const ParamTree& p, nn::Ctx& ctx, Tensor& out) {
      ctx.source = source;
      ctx.source_mask = mask;
      out = nn::apply(model, p, target, ctx);
      return cross_entropy(out, labels);
    };
    // Embedding 1, bias tables 2, encoder layer 4 + 2, decoder layers (4 + 4 + 2) each; tied head.
    for (int mp : {2, 4}) CHECK(check_against_one_rank(model, mp, loss, true) == 1 + 2 + 6 + 20);
  }
  c.gated = true, c.act = nn::Act::gelu, c.tie_embeddings = false;  // flan-T5
  const auto model = models::t5(c);
  const LossFn loss = [&](const ParamTree& p, nn::Ctx& ctx, Tensor& out) {
    ctx.source = source;
    out = nn::apply(model, p, target, ctx);
    return cross_entropy(out, labels);
  };
  CHECK(check_against_one_rank(model, 2, loss, true) == 1 + 2 + 7 + 22 + 1);
}

TEST_CASE(
    "tensor-parallel BART (post-LN, shared embedding, logit bias split by vocabulary) matches "
    "one rank",
    "[tensor_parallel]") {
  const auto model = models::bart({.vocab = 16,
                                   .dim = 16,
                                   .encoder_layers = 1,
                                   .decoder_layers = 1,
                                   .encoder_heads = 4,
                                   .decoder_heads = 2,
                                   .encoder_ffn = 24,
                                   .decoder_ffn = 32,
                                   .context = 8,
                                   .dropout = 0.1f,
                                   .scale_embedding = true});
  const Tensor source = tokens(2, 7, 16, 5), target = tokens(2, 5, 16, 6);
  const Tensor labels = labels_of(2, 5, 16, 7);
  const LossFn loss = [&](const ParamTree& p, nn::Ctx& ctx, Tensor& out) {
    ctx.source = source;
    out = nn::apply(model, p, target, ctx);
    return cross_entropy(out, labels);
  };
  // Embedding 1; encoder layer: q/k/v/o 4 + 3 biases, fc1 + its bias, fc2 = 10; decoder
  // layer: 7 + 7 + 3 = 17; logit bias 1.
  CHECK(check_against_one_rank(model, 2, loss, true) == 1 + 10 + 17 + 1);
}

TEST_CASE(
    "tensor-parallel BERT and RoBERTa classifiers (pooler column, classifier row) match one rank",
    "[tensor_parallel]") {
  const models::BertConfig c{.vocab = 16,
                             .dim = 16,
                             .layers = 2,
                             .heads = 4,
                             .hidden = 24,
                             .context = 12,
                             .labels = 4,
                             .dropout = 0.1f,
                             .pad = 1};
  const Tensor ids = tokens(3, 6, 16, 5), types = tokens(3, 6, 2, 6);
  const Tensor labels = tokens(1, 3, 4, 7).view({3});
  Tensor mask = Tensor::ones({3, 6});
  mask.data<float>()[0] = 0.f;  // row 0 left-padded
  auto loss_of = [&](const auto& model) {
    return LossFn([&](const ParamTree& p, nn::Ctx& ctx, Tensor& out) {
      ctx.token_types = types;
      ctx.mask = mask;
      out = nn::apply(model, p, ids, ctx);
      return cross_entropy(out, labels);
    });
  };
  // Embedding 1; per layer q/k/v/o 4 + 3 biases, fc1 + its bias, fc2 = 10; head 2 + 1 bias.
  const auto bert = models::bert(c);
  for (int mp : {2, 4}) CHECK(check_against_one_rank(bert, mp, loss_of(bert), false) == 1 + 20 + 3);
  const auto roberta = models::roberta(c);
  CHECK(check_against_one_rank(roberta, 2, loss_of(roberta), false) == 1 + 20 + 3);
}

TEST_CASE("tensor-parallel OPT (pre- and post-LN, projections, tied head) matches one rank",
          "[tensor_parallel]") {
  const Tensor ids = tokens(2, 6, 16, 11), labels = labels_of(2, 6, 16, 12);
  for (bool pre : {true, false}) {
    INFO((pre ? "pre-LN" : "post-LN, 8-wide embeddings"));
    const auto model = models::opt({.vocab = 16,
                                    .context = 8,
                                    .dim = 16,
                                    .layers = 2,
                                    .heads = 4,
                                    .ffn = 24,
                                    .embed_dim = pre ? 0 : 8,
                                    .pre_norm = pre,
                                    .final_norm = pre,
                                    .dropout = 0.1f});
    const LossFn loss = [&](const ParamTree& p, nn::Ctx& ctx, Tensor& out) {
      out = nn::apply(model, p, ids, ctx);
      return cross_entropy(out, labels);
    };
    // embed_tokens (the tied head's table); per layer q k v o + 3 biases, fc1 + bias, fc2.
    for (int mp : {2, 4}) CHECK(check_against_one_rank(model, mp, loss, true) == 1 + 2 * 10);
  }
}

TEST_CASE("tensor-parallel GPT-J (parallel block, partial rotary, biased head) matches one rank",
          "[tensor_parallel]") {
  const auto model = models::gptj({.vocab = 16,
                                   .context = 8,
                                   .dim = 16,
                                   .layers = 2,
                                   .heads = 4,
                                   .rotary_dim = 2,
                                   .inner = 24,
                                   .dropout = 0.1f,
                                   .embed_dropout = 0.1f});
  const Tensor ids = tokens(2, 6, 16, 13), labels = labels_of(2, 6, 16, 14);
  const LossFn loss = [&](const ParamTree& p, nn::Ctx& ctx, Tensor& out) {
    out = nn::apply(model, p, ids, ctx);
    return cross_entropy(out, labels);
  };
  // wte; per layer q k v o, fc1 + bias, fc2; the head's table and its bias.
  for (int mp : {2, 4}) CHECK(check_against_one_rank(model, mp, loss, true) == 1 + 2 * 7 + 2);
}

TEST_CASE("tensor-parallel GPT-NeoX (parallel and sequential residual) matches one rank",
          "[tensor_parallel]") {
  const Tensor ids = tokens(2, 6, 16, 15), labels = labels_of(2, 6, 16, 16);
  for (bool parallel : {true, false}) {
    INFO((parallel ? "parallel" : "sequential") << " residual");
    const auto model = models::gpt_neox({.vocab = 16,
                                         .dim = 16,
                                         .layers = 2,
                                         .heads = 4,
                                         .hidden = 24,
                                         .rotary_dim = 2,
                                         .parallel_residual = parallel,
                                         .dropout = 0.1f});
    const LossFn loss = [&](const ParamTree& p, nn::Ctx& ctx, Tensor& out) {
      out = nn::apply(model, p, ids, ctx);
      return cross_entropy(out, labels);
    };
    // embed_in; per layer q k v o + 3 biases, fc1 + bias, fc2; embed_out.
    for (int mp : {2, 4}) CHECK(check_against_one_rank(model, mp, loss, true) == 1 + 2 * 10 + 1);
  }
}

TEST_CASE("a tensor-parallel MLP classifier (column then row, dropout between) matches one rank",
          "[tensor_parallel]") {
  const auto model =
      models::mlp_classifier({.inputs = 12, .hidden = 8, .classes = 3, .dropout = 0.3f});
  const Tensor images = randn({5, 1, 3, 4}, 8);
  const Tensor labels = tokens(1, 5, 3, 9).view({5});
  const LossFn loss = [&](const ParamTree& p, nn::Ctx& ctx, Tensor& out) {
    out = nn::apply(model, p, images, ctx);
    return cross_entropy(out, labels);
  };
  // fc_1's weight and bias, fc_2's weight; the logits leave fc_2 whole.
  for (int mp : {2, 4}) CHECK(check_against_one_rank(model, mp, loss, false) == 3);
}

TEST_CASE(
    "a last column-parallel layer gives class-split logits; blocks that do not divide stay "
    "replicated",
    "[tensor_parallel]") {
  // fc_1 column, fc_2 row, fc_3 column again: its output is split by class.
  const auto model = nn::flatten() | nn::linear(12, 8) | nn::relu() | nn::dropout(0.25f) |
                     nn::linear(8, 8) | nn::relu() | nn::linear(8, 6);
  const Tensor images = randn({4, 12}, 10);
  const Tensor labels = Tensor::from<int64_t>(
      std::span<const int64_t>(std::vector<int64_t>{5, 0, -100, 3}), Shape{4});
  const LossFn loss = [&](const ParamTree& p, nn::Ctx& ctx, Tensor& out) {
    out = nn::apply(model, p, images, ctx);
    return cross_entropy(out, labels);
  };
  CHECK(check_against_one_rank(model, 2, loss, true) == 5);
  // 6 classes do not divide by 4: fc_3 is replicated and the logits are whole.
  CHECK(check_against_one_rank(model, 4, loss, false) == 3);
  // A CNN: replicated convolutions and pooling, then a class-split fc.
  const auto cnn =
      models::small_cnn({.channels = 1, .size = 8, .classes = 4, .conv1 = 3, .conv2 = 2});
  const Tensor pictures = randn({3, 1, 8, 8}, 16);
  const LossFn cnn_loss = [&](const ParamTree& p, nn::Ctx& ctx, Tensor& out) {
    out = nn::apply(cnn, p, pictures, ctx);
    return cross_entropy(out, tokens(1, 3, 4, 17).view({3}));
  };
  CHECK(check_against_one_rank(cnn, 2, cnn_loss, true) == 2);
  // 6 hidden units do not divide by 4 either: nothing splits, and the run
  // with ctx.mp set equals the one-rank run.
  const auto narrow = nn::flatten() | nn::linear(12, 6) | nn::relu() | nn::linear(6, 3);
  const LossFn narrow_loss = [&](const ParamTree& p, nn::Ctx& ctx, Tensor& out) {
    out = nn::apply(narrow, p, images, ctx);
    return cross_entropy(out, tokens(1, 4, 3, 11).view({4}));
  };
  CHECK(check_against_one_rank(narrow, 4, narrow_loss, false) == 0);
}

namespace {

// Random logits [2, 3, 8] whose last dim is split across `mp` ranks, and
// labels with ignored rows.
Tensor split_logits() { return randn({2, 3, 8}, 50); }
Tensor split_labels() {
  const std::vector<int64_t> v{5, -100, 1, 7, 0, -100};
  return Tensor::from<int64_t>(std::span<const int64_t>(v), Shape{2, 3});
}

}  // namespace

TEST_CASE("cross_entropy on vocabulary-split logits skips ignored labels", "[tensor_parallel]") {
  const Tensor logits = split_logits(), labels = split_labels();
  Tensor whole_logits = logits.clone().set_requires_grad(true);
  const Tensor want_loss = cross_entropy(whole_logits, labels);
  const Tensor want_grad = grad({want_loss}, {whole_logits})[0];
  const std::vector<int64_t> none(6, -100);
  const Tensor all_ignored = Tensor::from<int64_t>(std::span<const int64_t>(none), Shape{2, 3});
  for (int mp : {2, 4}) {
    const int64_t m = 8 / mp;
    std::vector<float> losses(static_cast<size_t>(mp)), ignored(static_cast<size_t>(mp));
    std::vector<Tensor> grads(static_cast<size_t>(mp));
    comm::ThreadsWorld(mp).run([&](comm::Comm& comm) {
      const int64_t begin = comm.rank() * m;
      Tensor mine = slice(logits, 2, begin, begin + m).clone().set_requires_grad(true);
      const Tensor split = nn::split_by(mine, comm, -1);
      const Tensor loss = cross_entropy(split, labels);
      losses[size_t(comm.rank())] = loss.item();
      grads[size_t(comm.rank())] = grad({loss}, {mine})[0];
      ignored[size_t(comm.rank())] = cross_entropy(split, all_ignored).item();
    });
    for (int r = 0; r < mp; ++r) {
      INFO("mp " << mp << ", rank " << r);
      CHECK(losses[size_t(r)] == Approx(want_loss.item()).epsilon(1e-6));
      CHECK(close(grads[size_t(r)], slice(want_grad, 2, r * m, (r + 1) * m)));
      CHECK(ignored[size_t(r)] == 0.f);
    }
  }
}

TEST_CASE("whole() gathers split tensors and reduces partial sums", "[tensor_parallel]") {
  const Tensor logits = split_logits(), w = randn({2, 3, 8}, 51);
  std::vector<Tensor> gathered(2), summed(2), grads(2), locals(2);
  std::vector<bool> plain(2);
  comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
    const size_t r = size_t(comm.rank());
    Tensor mine = slice(logits, 2, 4 * int64_t(r), 4 * int64_t(r) + 4).clone();
    mine.set_requires_grad(true);
    const Tensor split = nn::split_by(mine, comm, -1);
    const Tensor all = nn::whole(split);
    plain[r] = !all.placement() && !nn::whole(all).placement();
    gathered[r] = all.detach();
    grads[r] = grad({sum(all * w)}, {mine})[0];
    locals[r] = nn::local(split).detach();
    summed[r] = nn::whole(nn::partial_sum(mine.detach(), comm)).detach();
  });
  const Tensor sum_of_parts = slice(logits, 2, 0, 4) + slice(logits, 2, 4, 8);
  for (size_t r = 0; r < 2; ++r) {
    CHECK(plain[r]);
    CHECK(max_abs_diff(gathered[r], logits) == 0.f);
    CHECK(max_abs_diff(grads[r], slice(w, 2, 4 * int64_t(r), 4 * int64_t(r) + 4)) == 0.f);
    CHECK(max_abs_diff(locals[r], slice(logits, 2, 4 * int64_t(r), 4 * int64_t(r) + 4)) == 0.f);
    CHECK(max_abs_diff(summed[r], sum_of_parts) < 1e-6f);
  }
}

TEST_CASE("evaluation returns whole logits, so prediction works as on one rank",
          "[tensor_parallel]") {
  const auto model = models::gpt2(tiny_gpt());
  const Tensor ids = tokens(2, 8, 16, 12);
  const Tensor want = nn::apply(model, nn::init_params(model, 5), ids);
  const auto plan = shard::resolve(model, 2);
  std::vector<Tensor> logits(2), predicted(2);
  comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
    const ParamTree shard = train::init_shard(nn::param_entries(model), plan, 5, comm.rank(), 2);
    nn::Ctx ctx{.mp = &comm};  // train = false
    logits[size_t(comm.rank())] = nn::apply(model, shard, ids, ctx);
    predicted[size_t(comm.rank())] = argmax(logits[size_t(comm.rank())], -1);
  });
  for (size_t r = 0; r < 2; ++r) {
    REQUIRE(!logits[r].placement());
    CHECK(close(logits[r], want));
    CHECK(predicted[r].values<int64_t>() == argmax(want, -1).values<int64_t>());
  }
}

TEST_CASE("a split tensor read as a whole one fails, naming whole()", "[tensor_parallel]") {
  const auto model = models::gpt2(tiny_gpt());
  const Tensor ids = tokens(2, 8, 16, 13);
  const auto plan = shard::resolve(model, 2);
  std::vector<std::string> softmax_error(2), values_error(2), reshape_error(2), shape(2);
  comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
    const size_t r = size_t(comm.rank());
    const ParamTree shard = train::init_shard(nn::param_entries(model), plan, 5, comm.rank(), 2);
    nn::Ctx ctx = training_ctx();
    ctx.mp = &comm;
    const Tensor logits = nn::apply(model, shard, ids, ctx);
    shape[r] = logits.shape().str() + " " + logits.str();  // str() names the split, no values
    try {
      softmax(logits);
    } catch (const Error& e) {
      softmax_error[r] = e.what();
    }
    try {
      logits.detach().to_vector();
    } catch (const Error& e) {
      values_error[r] = e.what();
    }
    try {  // a reshape that moves the split dim cannot be gathered correctly
      nn::whole(reshape(logits, {2, -1}));
    } catch (const Error& e) {
      reshape_error[r] = e.what();
    }
  });
  for (size_t r = 0; r < 2; ++r) {
    // This rank's half of the vocabulary.
    CHECK(shape[r] ==
          "[2, 8, 8] f32[2, 8, 8] (split along its last dim across 2 model-parallel "
          "ranks (rank " +
              std::to_string(r) + " holds 8 of 16))");
    CHECK_THAT(softmax_error[r], Catch::Contains("nn::whole(t)") &&
                                     Catch::Contains("split along its last dim across 2"));
    CHECK_THAT(values_error[r], Catch::Contains("nn::whole(t)"));
    CHECK_THAT(reshape_error[r], Catch::Contains("call nn::whole() before reshaping"));
  }
}

TEST_CASE("shards without their group, or cut for another group size, are refused",
          "[tensor_parallel]") {
  const auto model = models::mlp_classifier({.inputs = 12, .hidden = 8, .classes = 3});
  const Tensor images = randn({2, 12}, 14);
  const ParamTree halves =
      train::shard_params(nn::init_params(model, 5), shard::resolve(model, 2), 0, 2);
  nn::Ctx alone;  // no ctx.mp
  CHECK_THROWS_WITH(nn::apply(model, halves, images, alone),
                    Catch::Contains("fc_1.weight") && Catch::Contains("set nn::Ctx::mp"));
  const ParamTree quarters =
      train::shard_params(nn::init_params(model, 5), shard::resolve(model, 4), 0, 4);
  std::vector<std::string> errors(2);
  comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
    nn::Ctx ctx{.mp = &comm};
    try {
      nn::apply(model, quarters, images, ctx);
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  });
  for (const std::string& e : errors)
    CHECK_THAT(e, Catch::Contains("fc_1.weight") && Catch::Contains("[4, 12]") &&
                      Catch::Contains("train::shard_params"));
  // A tied head built without the vocabulary size reads the table's split
  // from the plan, as the one told the size does: the same logits.
  const auto untold = nn::embedding(16, 8) | nn::tied_lm_head();
  const auto told = nn::embedding(16, 8) | nn::tied_lm_head(16);
  const ParamTree table =
      train::shard_params(nn::init_params(told, 5), shard::resolve(told, 2), 0, 2);
  CHECK(table.at("wte.weight").shape() == Shape{8, 8});
  std::vector<Tensor> untold_logits(2), told_logits(2);
  comm::ThreadsWorld(2).run([&](comm::Comm& comm) {
    const ParamTree mine =
        train::init_shard(nn::param_entries(told), shard::resolve(told, 2), 5, comm.rank(), 2);
    nn::Ctx ctx{.mp = &comm};
    untold_logits[size_t(comm.rank())] = nn::apply(untold, mine, tokens(1, 3, 16, 15), ctx);
    told_logits[size_t(comm.rank())] = nn::apply(told, mine, tokens(1, 3, 16, 15), ctx);
  });
  const Tensor one_rank = nn::apply(told, nn::init_params(told, 5), tokens(1, 3, 16, 15));
  for (size_t r = 0; r < 2; ++r) {
    CHECK(untold_logits[r].values<float>() == told_logits[r].values<float>());
    CHECK(max_abs_diff(told_logits[r], one_rank) < 1e-5f);
  }
}

TEST_CASE("layers read the split from the plan, not from the shards' shapes", "[tensor_parallel]") {
  // 6 heads over 4 shards do not divide: the plan replicates the attention
  // block. Q/K/V/O cut in quarters anyway have the shapes a split would have,
  // and are refused by name instead of being run as a split.
  const auto model = models::gpt2({.vocab = 16, .context = 8, .dim = 24, .layers = 1, .heads = 6});
  const ParamTree full = nn::init_params(model, 3);
  const auto plan = shard::resolve(model, 4);
  std::vector<std::string> errors(4);
  comm::ThreadsWorld(4).run([&](comm::Comm& comm) {
    ParamTree mine = train::shard_params(full, plan, comm.rank(), 4);
    REQUIRE(mine.at("h.0.attn.q_proj.weight").shape() == Shape{24, 24});  // replicated
    mine["h.0.attn.q_proj.weight"] = slice(full.at("h.0.attn.q_proj.weight"), 0, 0, 6);
    nn::Ctx ctx{.mp = &comm};
    try {
      nn::apply(model, mine, tokens(1, 3, 16, 4), ctx);
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  });
  for (const std::string& e : errors)
    CHECK_THAT(e, Catch::Contains("h.0.attn.q_proj.weight") && Catch::Contains("replicated") &&
                      Catch::Contains("[24, 24]"));
}

TEST_CASE("an LM head's logits are deferred in training and the loss and gradients are the same",
          "[tensor_parallel]") {
  for (const bool tied : {true, false}) {
    INFO("tied head " << tied);
    const auto gpt = models::gpt2(tiny_gpt());
    const auto llama =
        models::llama({.vocab = 16, .dim = 16, .layers = 1, .heads = 4, .hidden = 24});
    const ParamTree params = tied ? nn::init_params(gpt, 5) : nn::init_params(llama, 5);
    auto apply = [&](const ParamTree& p, nn::Ctx& ctx) {
      return tied ? nn::apply(gpt, p, tokens(2, 8, 16, 16), ctx)
                  : nn::apply(llama, p, tokens(2, 8, 16, 16), ctx);
    };
    const Tensor labels = labels_of(2, 8, 16, 17);
    std::string deferred_desc, read_error, slice_error;
    Tensor formed;  // nn::whole of the deferred logits
    auto deferred = value_and_grad(
        [&](const ParamTree& p) {
          nn::Ctx ctx = training_ctx();
          const Tensor logits = apply(p, ctx);
          REQUIRE(logits.placement());
          CHECK(!logits.placement()->holds_values());
          CHECK(logits.shape() == Shape{2, 8, 16});
          deferred_desc = logits.str();
          try {
            logits.to_vector();
          } catch (const Error& e) {
            read_error = e.what();
          }
          try {
            cross_entropy(logits.slice0(0, 1), labels.slice0(0, 1));
          } catch (const Error& e) {
            slice_error = e.what();
          }
          formed = nn::whole(logits).detach();
          return cross_entropy(logits, labels);
        },
        params);
    Tensor plain_logits;
    auto plain = value_and_grad(
        [&](const ParamTree& p) {
          nn::Ctx ctx = training_ctx();
          ctx.split_output = nn::Ctx::SplitOutput::never;
          const Tensor logits = apply(p, ctx);
          CHECK(!logits.placement());
          plain_logits = logits.detach();
          return cross_entropy(logits, labels);
        },
        params);
    CHECK(std::abs(deferred.first.item() - plain.first.item()) <= 1e-6f);
    CHECK(max_abs_diff(formed, plain_logits) == 0.f);
    REQUIRE(deferred.second.size() == plain.second.size());
    for (const auto& [name, g] : plain.second) {
      INFO(name);
      CHECK(close(deferred.second.at(name), g));
    }
    CHECK_THAT(deferred_desc, Catch::Contains("not formed yet"));
    CHECK_THAT(read_error,
               Catch::Contains("no values to read yet") && Catch::Contains("nn::whole(t)"));
    CHECK_THAT(slice_error, Catch::Contains("sliced or reshaped"));
    // Evaluation, or training with no gradient to record: formed logits.
    nn::Ctx eval;
    CHECK(!apply(params, eval).placement());
    nn::Ctx train = training_ctx();
    CHECK(!apply(params, train).placement());
  }
}
