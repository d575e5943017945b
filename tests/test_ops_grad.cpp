// Every differentiable op: gradient vs central finite differences, and for
// the ops with a separate higher-order path, the second-order gradient too.
#include "gradcheck.hpp"
#include "redco/core/allocator.hpp"

using namespace redco;
using redco::test::check_gradients;
using redco::test::check_second_order;
using redco::test::randn;

namespace {
Tensor positive(const Shape& s, uint64_t stream) {  // in [0.5, 2]: safe for log, sqrt, div
  return Tensor::uniform(s, 7, stream, 0.5f, 2.f);
}
Tensor ids(std::vector<int64_t> v, const Shape& s) { return Tensor::from<int64_t>(v, s); }
}  // namespace

TEST_CASE("binary ops with broadcasting", "[grad]") {
  const Shape a{2, 3, 4};
  for (Shape b : {Shape{2, 3, 4}, Shape{4}, Shape{3, 1}, Shape{2, 1, 4}, Shape{}}) {
    INFO("b = " << b.str());
    TensorList in{randn(a, 1), positive(b, 2)};
    check_gradients([](const TensorList& x) { return x[0] + x[1]; }, in, {0, 1});
    check_gradients([](const TensorList& x) { return x[0] - x[1]; }, in, {0, 1});
    check_gradients([](const TensorList& x) { return x[0] * x[1]; }, in, {0, 1});
    check_gradients([](const TensorList& x) { return x[0] / x[1]; }, in, {0, 1});
    check_gradients([](const TensorList& x) { return maximum(x[0], x[1]); }, in, {0, 1});
  }
}

TEST_CASE("scalar and unary ops", "[grad]") {
  TensorList in{randn({3, 5}, 3)}, pos{positive({3, 5}, 4)};
  check_gradients([](const TensorList& x) { return x[0] * 3.f + 1.f; }, in, {0});
  check_gradients([](const TensorList& x) { return 2.f - x[0] / 4.f; }, in, {0});
  check_gradients([](const TensorList& x) { return pow(x[0], 3.f); }, in, {0});
  check_gradients([](const TensorList& x) { return pow(x[0], -1.5f); }, pos, {0});
  check_gradients([](const TensorList& x) { return 2.f / x[0]; }, pos, {0});
  check_gradients([](const TensorList& x) { return -x[0]; }, in, {0});
  check_gradients([](const TensorList& x) { return exp(x[0]); }, in, {0});
  check_gradients([](const TensorList& x) { return log(x[0]); }, pos, {0});
  check_gradients([](const TensorList& x) { return tanh(x[0]); }, in, {0});
  check_gradients([](const TensorList& x) { return sqrt(x[0]); }, pos, {0});
  check_gradients([](const TensorList& x) { return rsqrt(x[0]); }, pos, {0});
  check_gradients([](const TensorList& x) { return sigmoid(x[0]); }, in, {0});
  check_gradients([](const TensorList& x) { return erf(x[0]); }, in, {0});
  check_gradients([](const TensorList& x) { return square(x[0]); }, in, {0});
  // relu and abs are checked away from their kink (|x| >= 0.5 > eps).
  check_gradients([](const TensorList& x) { return relu(x[0]); }, pos, {0});
  check_gradients([](const TensorList& x) { return relu(-x[0]); }, pos, {0});
  check_gradients([](const TensorList& x) { return abs(x[0] - 3.f) + abs(x[0]); }, pos, {0});
}

TEST_CASE("reductions and broadcasts", "[grad]") {
  TensorList in{randn({2, 3, 4}, 5)};
  check_gradients([](const TensorList& x) { return sum(x[0]); }, in, {0});
  check_gradients([](const TensorList& x) { return sum(x[0], {0, 2}); }, in, {0});
  check_gradients([](const TensorList& x) { return sum(x[0], {-1}, true); }, in, {0});
  check_gradients([](const TensorList& x) { return mean(x[0], {1}); }, in, {0});
  check_gradients([](const TensorList& x) { return mean(x[0]); }, in, {0});
  // max is piecewise linear: a small step keeps the finite difference on one piece.
  check_gradients([](const TensorList& x) { return max(x[0], 1); }, in, {0}, 1e-3f);
  check_gradients([](const TensorList& x) { return max(x[0], -1, true); }, in, {0}, 1e-3f);
  check_gradients([](const TensorList& x) { return broadcast_to(x[0], {5, 2, 3, 4}); }, in, {0});
  check_gradients([](const TensorList& x) { return sum_to(x[0], {3, 1}); }, in, {0});
}

TEST_CASE("max sends the gradient to the maximum, shared on ties", "[grad]") {
  Tensor x = Tensor::from({1.f, 5.f, 5.f, 2.f}, {1, 4});
  x.set_requires_grad(true);
  Tensor g = grad({sum(max(x, 1))}, {x})[0];
  CHECK(g.to_vector() == std::vector<float>{0.f, 0.5f, 0.5f, 0.f});
  CHECK(argmax(x, 1).values<int64_t>() == std::vector<int64_t>{1});
}

TEST_CASE("shape ops", "[grad]") {
  TensorList in{randn({2, 3, 4}, 6)};
  check_gradients([](const TensorList& x) { return reshape(x[0], {4, -1}); }, in, {0});
  check_gradients([](const TensorList& x) { return flatten(x[0]); }, in, {0});
  check_gradients([](const TensorList& x) { return transpose(x[0], 0, 2); }, in, {0});
  check_gradients([](const TensorList& x) { return permute(x[0], {1, 2, 0}); }, in, {0});
  check_gradients([](const TensorList& x) { return slice(x[0], 1, 1, 3); }, in, {0});
  check_gradients([](const TensorList& x) { return slice(x[0], -1, 0, -1); }, in, {0});
  TensorList two{randn({2, 3}, 7), randn({2, 5}, 8)};
  check_gradients([](const TensorList& x) { return concat(x, 1); }, two, {0, 1});
  check_gradients(
      [](const TensorList& x) {
        TensorList p = split(x[0], {1, 3}, 2);
        return p[1] * 2.f + sum(p[0], {-1}, true);
      },
      in, {0});
  // Unused parts get zero gradient; split is one node with three outputs.
  check_gradients([](const TensorList& x) { return split(x[0], {1, 1, 2}, -1)[1] * 3.f; }, in, {0});
  check_second_order(
      [](const TensorList& x) {
        return square(split(x[0], {2, 1}, 1)[0]);
      },
      in, 0, {0});
}

TEST_CASE("matmul with transpose flags and broadcast batches; linear", "[grad]") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("ta " << ta << " tb " << tb);
      const Shape a = ta ? Shape{2, 4, 3} : Shape{2, 3, 4};
      const Shape b = tb ? Shape{5, 4} : Shape{4, 5};  // broadcast over the batch
      check_gradients([ta, tb](const TensorList& x) { return matmul(x[0], x[1], ta, tb); },
                      {randn(a, 9), randn(b, 10)}, {0, 1});
      check_second_order([ta, tb](const TensorList& x) { return matmul(x[0], x[1], ta, tb); },
                         {randn(a, 9), randn(b, 10)}, 0, {0, 1});
    }
  check_gradients([](const TensorList& x) { return linear(x[0], x[1], x[2]); },
                  {randn({2, 3, 4}, 11), randn({5, 4}, 12), randn({5}, 13)}, {0, 1, 2});
}

TEST_CASE("softmax family and norms, first and second order", "[grad]") {
  TensorList in{randn({3, 6}, 14)};
  for (auto f : {+[](const TensorList& x) { return softmax(x[0]); },
                 +[](const TensorList& x) { return log_softmax(x[0]); }}) {
    check_gradients(f, in, {0});
    check_second_order(f, in, 0, {0});
  }
  TensorList ln{randn({4, 6}, 15), Tensor::uniform({6}, 1, 16, 0.5f, 1.5f), randn({6}, 17)};
  auto layer = [](const TensorList& x) { return layer_norm(x[0], x[1], x[2]); };
  auto layer_nobias = [](const TensorList& x) { return layer_norm(x[0], x[1]); };
  auto rms = [](const TensorList& x) { return rms_norm(x[0], x[1]); };
  check_gradients(layer, ln, {0, 1, 2});
  check_gradients(layer_nobias, ln, {0, 1});
  check_gradients(rms, ln, {0, 1});
  check_second_order(layer, ln, 0, {0, 1, 2});
  check_second_order(rms, ln, 1, {0, 1});
}

TEST_CASE("a norm's output read by linear layers is recomputed in backward, not kept", "[grad]") {
  // Through linear and linear_stacked, first and second order.
  const TensorList in{randn({2, 3, 6}, 57), Tensor::uniform({6}, 1, 58, 0.5f, 1.5f), randn({6}, 59),
                      randn({5, 6}, 60), randn({4, 6}, 61)};
  auto ln_linear = [](const TensorList& x) {
    const Tensor stacked = linear_stacked(rms_norm(x[0], x[1]), {x[3], x[4]});  // [2, 3, 9]
    return linear(layer_norm(x[0], x[1], x[2]), x[3]) * slice(stacked, 2, 4, 9);
  };
  check_gradients(ln_linear, in, {0, 1, 2, 3, 4});
  check_second_order(ln_linear, in, 0, {0, 1, 3});
  check_second_order(ln_linear, in, 3, {0, 2, 4});
  // Memory: after forward only the norm's input is held, not its output.
  const Tensor x = randn({512, 512}, 62).set_requires_grad(true);  // 1 MiB
  const Tensor gamma = Tensor::ones({512}).set_requires_grad(true);
  const Tensor w = randn({8, 512}, 63).set_requires_grad(true);
  auto& alloc = CachingAllocator::cpu();
  const size_t before = alloc.stats().bytes_in_use;
  const Tensor y = linear(layer_norm(x, gamma), w);  // [512, 8]: 16 KiB
  CHECK(alloc.stats().bytes_in_use - before < size_t(512 * 512 * 4) / 2);
  const TensorList g = grad({sum(y)}, {x, gamma, w});
  // The same gradients as with the output kept (an extra reference keeps it).
  const Tensor kept = layer_norm(x, gamma);
  const TensorList want = grad({sum(linear(kept * 1.f, w))}, {x, gamma, w});
  for (size_t i = 0; i < 3; ++i) CHECK(test::max_abs_diff(g[i], want[i]) < 1e-6f);
}

TEST_CASE("activations, first and second order", "[grad]") {
  TensorList in{randn({3, 7}, 18)};
  for (auto f : {+[](const TensorList& x) { return gelu(x[0], true); },
                 +[](const TensorList& x) { return gelu(x[0], false); },
                 +[](const TensorList& x) { return silu(x[0]); }}) {
    check_gradients(f, in, {0});
    check_second_order(f, in, 0, {0});
  }
}

TEST_CASE("cross entropy with an ignored label", "[grad]") {
  Tensor labels = ids({2, -100, 0, 4}, {2, 2});
  auto f = [labels](const TensorList& x) { return cross_entropy(x[0], labels); };
  TensorList in{randn({2, 2, 5}, 19)};
  check_gradients(f, in, {0});
  check_second_order(f, in, 0, {0});
  // The mean is over the three counted rows; the ignored row gets no gradient.
  Tensor x = in[0].detach().set_requires_grad(true);
  Tensor g = grad({f({x})}, {x})[0];
  for (float v : g[0][1].to_vector()) CHECK(v == 0.f);
  Tensor all_ignored = ids({-100, -100}, {2});
  CHECK(cross_entropy(randn({2, 5}, 20), all_ignored).item() == 0.f);
}

TEST_CASE("cross entropy writes its gradient into logits nobody else holds", "[grad]") {
  const int64_t rows = 64, vocab = 4096;  // logits: 1 MiB
  const Tensor a = randn({rows, 16}, 41).set_requires_grad(true);
  const Tensor w = randn({16, vocab}, 42).set_requires_grad(true);
  std::vector<int64_t> label_values(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) label_values[size_t(r)] = (r * 37) % vocab;
  const Tensor labels = ids(label_values, {rows});
  auto& alloc = CachingAllocator::cpu();
  // Logits dropped after the loss (what a loss function returning
  // cross_entropy(model(x), y) does): their buffer takes the gradient.
  alloc.reset_peak();
  const size_t base_dropped = alloc.stats().bytes_in_use;
  // (A temporary would live until the end of the full expression: a statement
  // of its own drops it, as returning from a loss function does.)
  const Tensor dropped_loss = cross_entropy(matmul(a, w), labels);
  const TensorList dropped = grad({dropped_loss}, {a, w});
  const size_t peak_dropped = alloc.stats().peak_bytes_in_use - base_dropped;
  // Logits kept by the caller: they must come out of backward unchanged.
  alloc.reset_peak();
  const size_t base_kept = alloc.stats().bytes_in_use;
  const Tensor logits = matmul(a, w);
  const std::vector<float> before = logits.to_vector();
  const TensorList kept = grad({cross_entropy(logits, labels)}, {a, w});
  const size_t peak_kept = alloc.stats().peak_bytes_in_use - base_kept;
  CHECK(logits.to_vector() == before);
  for (size_t i = 0; i < 2; ++i) CHECK(dropped[i].to_vector() == kept[i].to_vector());
  CHECK(peak_kept >= peak_dropped + size_t(rows * vocab) * sizeof(float));
  // retain_graph: the second backward must see the logits, not the gradient.
  const Tensor loss = cross_entropy(matmul(a, w), labels);
  const TensorList first = grad({loss}, {a, w}, {}, {.retain_graph = true});
  const TensorList second = grad({loss}, {a, w});
  for (size_t i = 0; i < 2; ++i) CHECK(first[i].to_vector() == second[i].to_vector());
  CHECK(first[0].to_vector() == dropped[0].to_vector());
}

TEST_CASE("linear_cross_entropy equals cross_entropy(x w^T), values and gradients", "[grad]") {
  // 13 rows in chunks of 5, 5 and 3; one row ignored.
  const Tensor labels = ids({3, 0, 6, -100, 1, 2, 6, 5, 4, 0, 1, 3, 2}, {13});
  const TensorList in{randn({13, 4}, 51), randn({7, 4}, 52)};
  auto fused = [labels](const TensorList& x) {
    return linear_cross_entropy(x[0], x[1], labels, -100, 5);
  };
  auto plain = [labels](const TensorList& x) {
    return cross_entropy(matmul(x[0], x[1], false, true), labels);
  };
  check_gradients(fused, in, {0, 1});
  check_second_order(fused, in, 0, {0, 1});  // through the composition
  check_second_order(fused, in, 1, {0, 1});
  for (int64_t chunk : {0, 1, 5, 13, 64}) {
    INFO("chunk " << chunk);
    TensorList leaves;
    for (const Tensor& t : in) leaves.push_back(t.detach().set_requires_grad(true));
    const Tensor lf = linear_cross_entropy(leaves[0], leaves[1], labels, -100, chunk);
    const Tensor lp = plain(leaves);
    CHECK(std::abs(lf.item() - lp.item()) < 1e-6f);
    // An incoming gradient other than 1 scales both gradients.
    const TensorList gf = grad({lf * 3.f}, leaves), gp = grad({lp * 3.f}, leaves);
    for (size_t i = 0; i < 2; ++i) CHECK(test::max_abs_diff(gf[i], gp[i]) < 1e-6f);
  }
  // retain_graph: the second backward gets the same gradients.
  TensorList leaves;
  for (const Tensor& t : in) leaves.push_back(t.detach().set_requires_grad(true));
  const Tensor loss = fused(leaves);
  const TensorList first = grad({loss}, leaves, {}, {.retain_graph = true});
  const TensorList second = grad({loss}, leaves);
  for (size_t i = 0; i < 2; ++i) CHECK(first[i].to_vector() == second[i].to_vector());
  // Without a recorded graph it is the loss alone; every row ignored: 0.
  CHECK(std::abs(fused(in).item() - plain(in).item()) < 1e-6f);
  CHECK(linear_cross_entropy(in[0].view({1, 13, 4}), in[1],
                             ids(std::vector<int64_t>(13, -100), {1, 13}))
            .item() == 0.f);
  CHECK_THROWS_WITH(linear_cross_entropy(in[0], randn({7, 5}, 1), labels),
                    Catch::Contains("does not match the head's weight"));
  CHECK_THROWS_WITH(linear_cross_entropy(in[0], in[1], ids({1, 2}, {2})),
                    Catch::Contains("labels of shape [13]"));
}

TEST_CASE("bias_gelu_linear equals linear(gelu(y + b), w), values and gradients", "[grad]") {
  TensorList in{randn({2, 3, 6}, 43), randn({6}, 44), randn({4, 6}, 45)};
  for (bool tanh_approx : {true, false}) {
    INFO("tanh " << tanh_approx);
    auto fused = [tanh_approx](const TensorList& x) {
      return bias_gelu_linear(x[0], x[1], x[2], tanh_approx);
    };
    auto plain = [tanh_approx](const TensorList& x) {
      return linear(gelu(x[0] + x[1], tanh_approx), x[2]);
    };
    check_gradients(fused, in, {0, 1, 2});
    check_second_order(fused, in, 0, {0, 1, 2});
    check_second_order(fused, in, 2, {0, 2});
    TensorList leaves;
    for (const Tensor& t : in) leaves.push_back(t.detach().set_requires_grad(true));
    const Tensor r = randn({2, 3, 4}, 46);
    const Tensor yf = fused(leaves), yp = plain(leaves);
    CHECK(test::max_abs_diff(yf, yp) < 1e-6f);
    const TensorList gf = grad({sum(yf * r)}, leaves), gp = grad({sum(yp * r)}, leaves);
    for (size_t i = 0; i < 3; ++i) CHECK(test::max_abs_diff(gf[i], gp[i]) < 1e-5f);
  }
  auto no_bias = [](const TensorList& x) { return bias_gelu_linear(x[0], Tensor(), x[1]); };
  check_gradients(no_bias, {randn({5, 6}, 47), randn({3, 6}, 48)}, {0, 1});
  CHECK_THROWS_WITH(bias_gelu_linear(randn({2, 5}, 1), Tensor(), randn({3, 6}, 2)),
                    Catch::Contains("does not match weight"));
}

TEST_CASE("bias_gelu_linear under bf16 reads y rounded to bf16 and keeps it so", "[grad][bf16]") {
  // [rows, hidden] = [1024, 256]: y is 1 MiB in f32 (whole allocator blocks).
  const Tensor y = randn({4, 256, 256}, 61), b = randn({256}, 62), w = randn({64, 256}, 63);
  const Tensor r = randn({4, 256, 64}, 64);
  auto grads = [&](const Tensor& y_in, Precision p) {
    PrecisionGuard guard(p);
    TensorList leaves{y_in.detach().set_requires_grad(true), b.detach().set_requires_grad(true),
                      w.detach().set_requires_grad(true)};
    return grad({sum(bias_gelu_linear(leaves[0], leaves[1], leaves[2]) * r)}, leaves);
  };
  // Bit for bit the bf16 run on y already rounded: forward and backward saw
  // the same rounded y (the products round their operands either way).
  const TensorList mixed = grads(y, Precision::bf16);
  const TensorList want = grads(y.to(DType::bf16).to(DType::f32), Precision::bf16);
  const TensorList full = grads(y, Precision::f32);
  for (size_t i = 0; i < 3; ++i) {
    INFO("gradient " << i);
    CHECK(mixed[i].to_vector() == want[i].to_vector());
    CHECK(test::max_abs_diff(mixed[i], full[i]) > 0.f);  // it did run in bf16
  }
  auto kept_bytes = [&](Precision p) {
    PrecisionGuard guard(p);
    Tensor z;
    int64_t before = 0;
    {
      const Tensor yi = y.clone().set_requires_grad(true);
      before = int64_t(CachingAllocator::cpu().stats().bytes_in_use);
      z = bias_gelu_linear(yi, b, w);
    }  // the caller's y is gone; the node keeps what backward needs
    return int64_t(CachingAllocator::cpu().stats().bytes_in_use) - before;
  };
  const int64_t f32_kept = kept_bytes(Precision::f32), bf16_kept = kept_bytes(Precision::bf16);
  INFO("kept past forward: f32 " << f32_kept << " bytes, bf16 " << bf16_kept);
  CHECK(f32_kept - bf16_kept == int64_t(y.nbytes()) / 2);
}

TEST_CASE("a tied table's embedding gradient adds onto its head gradient in place", "[grad]") {
  const int64_t vocab = 8192, dim = 64;  // the table: 2 MiB
  const Tensor tok = ids({5, 1, 8191, 5, 0, 77, 5, 3}, {8});
  const Tensor r = randn({8, vocab}, 53);
  auto tied = [tok, r](const TensorList& x) {
    return sum(matmul(embedding(x[0], tok), x[0], false, true) * r);
  };
  const Tensor small_table = randn({vocab, dim}, 54, 0.1f);
  const Tensor w = small_table.detach().set_requires_grad(true);
  // Against the two uses' gradients computed apart and summed.
  const Tensor head_only =
      grad({sum(matmul(embedding(w.detach(), tok), w, false, true) * r)}, {w})[0];
  const Tensor emb_only =
      grad({sum(matmul(embedding(w, tok), w.detach(), false, true) * r)}, {w})[0];
  auto& alloc = CachingAllocator::cpu();
  const Tensor loss = tied({w});
  alloc.reset_peak();
  const size_t base = alloc.stats().bytes_in_use;
  const Tensor g = grad({loss}, {w})[0];
  const size_t extra = alloc.stats().peak_bytes_in_use - base;
  CHECK(test::max_abs_diff(g, head_only + emb_only) < 1e-5f);
  // One [vocab, dim] gradient buffer, not a second one for the embedding's part.
  CHECK(extra < size_t(vocab * dim) * sizeof(float) * 7 / 4);
  const Tensor few = ids({3, 1, 3, 0}, {4}), r2 = randn({4, 6}, 56);
  check_second_order(  // create_graph: the composed path
      [few, r2](const TensorList& x) {
        return sum(matmul(embedding(x[0], few), x[0], false, true) * r2);
      },
      {randn({6, 4}, 55)}, 0, {0});
}

TEST_CASE("embedding, rotary, dropout", "[grad]") {
  Tensor tok = ids({1, 3, 1, 0, 2, 3}, {2, 3});
  auto emb = [tok](const TensorList& x) { return embedding(x[0], tok); };
  check_gradients(emb, {randn({4, 5}, 21)}, {0});
  check_second_order([tok](const TensorList& x) { return square(embedding(x[0], tok)); },
                     {randn({4, 5}, 21)}, 0, {0});
  auto rot = [](const TensorList& x) { return rotary(x[0], 3); };
  check_gradients(rot, {randn({1, 2, 5, 4}, 22)}, {0});
  auto drop = [](const TensorList& x) { return dropout(x[0], 0.3f, 5, 6); };
  check_gradients(drop, {randn({4, 8}, 23)}, {0});
}

TEST_CASE("fused attention equals the unfused composition, values and gradients", "[grad]") {
  struct Case {
    int64_t Hq, Hkv, Tq, Tk;
    bool causal;
  };
  for (Case c : {Case{2, 2, 5, 5, true}, Case{2, 2, 4, 6, false}, Case{4, 2, 3, 7, true},
                 Case{4, 1, 6, 6, true}}) {
    INFO("Hq " << c.Hq << " Hkv " << c.Hkv << " Tq " << c.Tq << " Tk " << c.Tk);
    TensorList in{randn({2, c.Hq, c.Tq, 8}, 24), randn({2, c.Hkv, c.Tk, 8}, 25),
                  randn({2, c.Hkv, c.Tk, 8}, 26)};
    for (auto& t : in) t.set_requires_grad(true);
    Tensor fused = attention(in[0], in[1], in[2], c.causal);
    Tensor ref = attention_reference(in[0], in[1], in[2], c.causal);
    Tensor r = randn(fused.shape(), 27);
    TensorList gf = grad({sum(fused * r)}, in), gr = grad({sum(ref * r)}, in);
    auto close = [](const Tensor& a, const Tensor& b) {
      auto x = a.to_vector(), y = b.to_vector();
      for (size_t i = 0; i < x.size(); ++i) CHECK(std::abs(x[i] - y[i]) < 1e-4f);
    };
    close(fused, ref);
    for (int i = 0; i < 3; ++i) close(gf[size_t(i)], gr[size_t(i)]);
    auto f = [c](const TensorList& x) { return attention(x[0], x[1], x[2], c.causal); };
    check_gradients(f, in, {0, 1, 2});
  }
  auto f = [](const TensorList& x) { return attention(x[0], x[1], x[2], true); };
  check_second_order(f, {randn({1, 2, 3, 4}, 28), randn({1, 2, 3, 4}, 29), randn({1, 2, 3, 4}, 30)},
                     0, {0, 1, 2});
}

TEST_CASE("attention over padded rows with a score bias equals the composition", "[grad]") {
  auto ranges = [](std::vector<int64_t> lo, std::vector<int64_t> hi) {
    AttentionExtras x;
    x.key_begin = Tensor::from<int64_t>(std::span<const int64_t>(lo), {int64_t(lo.size())});
    x.key_end = Tensor::from<int64_t>(std::span<const int64_t>(hi), {int64_t(hi.size())});
    return x;
  };
  struct Case {
    int64_t Tq, Tk;
    bool causal, bias;
    std::vector<int64_t> lo, hi;  // per batch row: right padding, left padding, an empty row
    std::vector<int64_t> off{};   // per-row causal offsets (a KV cache), or none
    bool row_bias = false;        // a bias per batch row [B, Hq, Tq, Tk]
  };
  // 130 keys span three 64-key tiles: whole tiles are skipped and others cut.
  for (const Case& c : {Case{130, 130, true, false, {0, 70, 9}, {100, 130, 9}},
                        Case{130, 130, false, true, {0, 66, 3}, {130, 128, 64}},
                        Case{5, 130, true, true, {0, 127, 40}, {120, 130, 40}},
                        Case{7, 9, false, true, {2, 0, 0}, {9, 4, 9}},
                        // A cache of 130 slots: rows filled to 3, 67 and 127 slots, 3 new queries.
                        Case{3, 130, true, true, {0, 0, 0}, {3, 67, 127}, {0, 64, 124}},
                        Case{3, 130, true, true, {0, 0, 0}, {3, 67, 127}, {0, 64, 124}, true},
                        Case{7, 9, false, true, {2, 0, 0}, {9, 4, 9}, {}, true},
                        Case{1, 130, true, false, {0, 5, 0}, {1, 100, 130}, {0, 99, 129}}}) {
    INFO("Tq " << c.Tq << " Tk " << c.Tk << " causal " << c.causal << " bias " << c.bias
               << " per row " << c.row_bias);
    AttentionExtras x = ranges(c.lo, c.hi);
    if (!c.off.empty())
      x.causal_offset =
          Tensor::from<int64_t>(std::span<const int64_t>(c.off), {int64_t(c.off.size())});
    TensorList in{randn({3, 4, c.Tq, 8}, 60), randn({3, 2, c.Tk, 8}, 61),
                  randn({3, 2, c.Tk, 8}, 62)};
    if (c.bias)
      in.push_back(c.row_bias ? randn({3, 4, c.Tq, c.Tk}, 63) : randn({4, c.Tq, c.Tk}, 63));
    for (auto& t : in) t.set_requires_grad(true);
    auto with = [&](const TensorList& t) {
      AttentionExtras y = x;
      if (t.size() > 3) y.bias = t[3];
      return y;
    };
    const Tensor fused = attention(in[0], in[1], in[2], c.causal, -1.f, with(in));
    const Tensor ref = attention_reference(in[0], in[1], in[2], c.causal, -1.f, with(in));
    CHECK(test::max_abs_diff(fused, ref) < 1e-4f);
    const Tensor r = randn(fused.shape(), 64);
    const TensorList gf = grad({sum(fused * r)}, in), gr = grad({sum(ref * r)}, in);
    for (size_t i = 0; i < in.size(); ++i) CHECK(test::max_abs_diff(gf[i], gr[i]) < 1e-4f);
    // The empty row: zero output and zero gradient.
    const Tensor empty_row = slice(fused, 0, 2, 3);
    if (c.lo[2] == c.hi[2]) CHECK(max(abs(flatten(empty_row, 0)), 0).item() == 0.f);
  }
  // Finite differences on a small case, the bias included.
  AttentionExtras x = ranges({1, 0}, {5, 3});
  auto f = [x](const TensorList& t) {
    AttentionExtras y = x;
    y.bias = t[3];
    return attention(t[0], t[1], t[2], true, 0.7f, y);
  };
  check_gradients(f,
                  {randn({2, 2, 4, 4}, 65), randn({2, 1, 5, 4}, 66), randn({2, 1, 5, 4}, 67),
                   randn({2, 4, 5}, 68)},
                  {0, 1, 2, 3});
  check_second_order(f,
                     {randn({2, 2, 4, 4}, 65), randn({2, 1, 5, 4}, 66), randn({2, 1, 5, 4}, 67),
                      randn({2, 4, 5}, 68)},
                     3, {0, 3});
}

TEST_CASE("attention_merged_heads equals attention with its heads merged", "[grad]") {
  TensorList in{randn({2, 4, 5, 8}, 50), randn({2, 2, 5, 8}, 51), randn({2, 2, 5, 8}, 52)};
  for (auto& t : in) t.set_requires_grad(true);
  auto merged = [](const TensorList& x) { return attention_merged_heads(x[0], x[1], x[2], true); };
  auto plain = [](const TensorList& x) {
    return reshape(transpose(attention(x[0], x[1], x[2], true), 1, 2), {2, 5, 32});
  };
  const Tensor ym = merged(in), yp = plain(in);
  CHECK(ym.shape() == Shape{2, 5, 32});
  CHECK(ym.to_vector() == yp.to_vector());  // the same kernel, then a copy
  const Tensor r = randn({2, 5, 32}, 53);
  const TensorList gm = grad({sum(ym * r)}, in), gp = grad({sum(yp * r)}, in);
  for (size_t i = 0; i < 3; ++i) CHECK(gm[i].to_vector() == gp[i].to_vector());
  check_gradients(merged, in, {0, 1, 2});
  check_second_order(merged,
                     {randn({1, 2, 3, 4}, 54), randn({1, 2, 3, 4}, 55), randn({1, 2, 3, 4}, 56)}, 0,
                     {0, 1, 2});
}

TEST_CASE("linear_stacked equals linear on the concatenated weights", "[grad]") {
  TensorList in{randn({2, 3, 4}, 57), randn({5, 4}, 58), randn({2, 4}, 59), randn({3, 4}, 60),
                randn({5}, 61),       randn({2}, 62),    randn({3}, 63)};
  auto stacked = [](const TensorList& x) {
    return linear_stacked(x[0], {x[1], x[2], x[3]}, {x[4], x[5], x[6]});
  };
  auto plain = [](const TensorList& x) {
    return linear(x[0], concat({x[1], x[2], x[3]}, 0), concat({x[4], x[5], x[6]}, 0));
  };
  check_gradients(stacked, in, {0, 1, 2, 3, 4, 5, 6});
  check_second_order(stacked, in, 0, {0, 1, 3});
  TensorList leaves;
  for (const Tensor& t : in) leaves.push_back(t.detach().set_requires_grad(true));
  const Tensor ys = stacked(leaves), yp = plain(leaves);
  CHECK(ys.to_vector() == yp.to_vector());
  const Tensor r = randn({2, 3, 10}, 64);
  const TensorList gs = grad({sum(ys * r)}, leaves), gp = grad({sum(yp * r)}, leaves);
  for (size_t i = 0; i < leaves.size(); ++i) CHECK(test::max_abs_diff(gs[i], gp[i]) < 1e-5f);
  auto no_bias = [](const TensorList& x) { return linear_stacked(x[0], {x[1], x[2]}); };
  check_gradients(no_bias, {randn({3, 4}, 65), randn({2, 4}, 66), randn({1, 4}, 67)}, {0, 1, 2});
  CHECK_THROWS_WITH(linear_stacked(randn({3, 4}, 1), {randn({2, 4}, 2)}, {randn({3}, 3)}),
                    Catch::Contains("must be [2]"));
}

TEST_CASE("conv2d and pooling, first and second order", "[grad]") {
  TensorList in{randn({2, 2, 5, 5}, 31), randn({3, 2, 3, 3}, 32, 0.5f), randn({3}, 33)};
  for (auto [stride, pad] : {std::pair{1, 0}, std::pair{2, 1}}) {
    auto f = [s = stride, p = pad](const TensorList& x) { return conv2d(x[0], x[1], x[2], s, p); };
    check_gradients(f, in, {0, 1, 2});
    check_second_order(f, in, 0, {0, 1});
    check_second_order(f, in, 1, {0, 1});
  }
  TensorList img{randn({2, 3, 6, 6}, 34)};
  auto maxp = [](const TensorList& x) { return max_pool2d(x[0], 2); };
  auto avgp = [](const TensorList& x) { return avg_pool2d(x[0], 3, 2); };
  check_gradients(maxp, img, {0}, 1e-3f);
  check_gradients(avgp, img, {0});
  check_second_order([](const TensorList& x) { return square(max_pool2d(x[0], 2)); }, img, 0, {0},
                     1e-3f);
  check_second_order([](const TensorList& x) { return square(avg_pool2d(x[0], 3, 2)); }, img, 0,
                     {0});
}
