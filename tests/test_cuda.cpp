// The CUDA backend against the CPU backend: every implemented op runs on the
// same random inputs on both devices (copy to the GPU, run, copy back) and the
// results must agree to a per-op tolerance (bitwise where the GPU kernel is
// specified to match: embedding backward, dropout masks, layout ops). Plus
// device memory (copies, conversions, allocator reuse) and a small autodiff
// model whose loss and gradients must match the CPU run.
//
// Without a GPU (CI) the GPU cases exit 77 (Meson's SKIP); the cuBLAS loader
// case, which needs no GPU, runs as its own Meson test (cuda_loader).
#include <dlfcn.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "redco/autodiff/functional.hpp"
#include "redco/autodiff/node.hpp"
#include "redco/ops/backend.hpp"
#include "redco/ops/cuda/cublas_api.hpp"
#include "redco/ops/cuda/cuda_backend.hpp"

namespace redco {
namespace {

using namespace cuda_test;

TEST_CASE("cuBLAS is not loaded until a GPU GEMM needs it, then every entry point resolves",
          "[cuda][loader]") {
  // Runs without a GPU: linking cuBLAS cost every process ~150 MB of RSS, so
  // the backend opens it on first use. Until then it is not in the process...
  CHECK(dlopen(cuda::cublas_library_name(), RTLD_NOW | RTLD_NOLOAD) == nullptr);
  // ... and once opened, every function the backend calls is there.
  const cuda::CublasApi& api = cuda::cublas();
  CHECK(api.create != nullptr);
  CHECK(api.set_stream != nullptr);
  CHECK(api.set_workspace != nullptr);
  CHECK(api.gemm_strided_batched_ex != nullptr);
  CHECK(std::string(api.status_name(CUBLAS_STATUS_NOT_INITIALIZED)) ==
        "CUBLAS_STATUS_NOT_INITIALIZED");
  CHECK(dlopen(cuda::cublas_library_name(), RTLD_NOW | RTLD_NOLOAD) != nullptr);
}

TEST_CASE("cuda: tensors move between host and device", "[cuda]") {
  REQUIRE_GPU();
  Tensor h = rnd({3, 5, 7}, 1);
  Tensor d = dev(h);
  CHECK(d.device() == kGpu);
  CHECK_FALSE(d.shares_storage_with(h));
  same(d, h);
  CHECK(d.to(Device::cpu()).values<float>() == h.values<float>());
  Tensor z = Tensor::zeros({1000, 3}, DType::f32, kGpu);
  CHECK(z.to(Device::cpu()).to_vector() == std::vector<float>(3000, 0.f));
  z.fill(2.5f);
  CHECK(z.to(Device::cpu()).to_vector() == std::vector<float>(3000, 2.5f));
  // The host reads device memory only through an explicit copy (to_vector and
  // item are such copies; data() is a direct read).
  CHECK_THROWS_WITH(z.data<float>(), Catch::Contains("lives on cuda:0"));
  Tensor c = d.clone();  // device-to-device
  d.fill(0.f);
  same(c, h);
  for (DType t : {DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
    // Conversions on the device round exactly like the CPU ones.
    Tensor hx = rnd({257}, 2, -300.f, 300.f).to(t), gx = dev(h.view({-1})).to(t);
    CHECK(gx.to(Device::cpu()).to(DType::f32).values<float>() ==
          h.view({-1}).to(t).to(DType::f32).values<float>());
    same(dev(hx).to(DType::f32), hx.to(DType::f32));
  }
  Tensor dst = Tensor::empty({3, 5, 7}, DType::bf16, kGpu);
  dst.copy_from(h);  // host f32 -> device bf16
  same(dst.to(DType::f32), h.to(DType::bf16).to(DType::f32));
  CHECK(Tensor::scalar(3.f).to(kGpu).to(Device::cpu()).item() == 3.f);
  CHECK(d.str().find("cuda:0") != std::string::npos);
}

TEST_CASE("cuda: a repeated step allocates nothing new", "[cuda]") {
  REQUIRE_GPU();
  Tensor x = dev(rnd({64, 96}, 3)), w = dev(rnd({96, 80}, 4));
  auto step = [&] {
    Tensor y = gpu().matmul(x, w, false, false);
    Tensor s = gpu().softmax(gpu().unary(UnaryOp::tanh, y));
    return gpu().reduce(ReduceOp::sum, s, std::vector<int>{0}).to(Device::cpu()).to_vector();
  };
  step();
  const AllocatorStats before = cuda::memory_stats();
  for (int i = 0; i < 3; ++i) step();
  const AllocatorStats after = cuda::memory_stats();
  CHECK(after.system_allocs == before.system_allocs);
  CHECK(after.cache_hits > before.cache_hits);
  CHECK(after.bytes_in_use == before.bytes_in_use);
}

TEST_CASE("cuda: unary ops match the cpu", "[cuda]") {
  REQUIRE_GPU();
  const Tensor x = rnd({37, 129}, 5), pos = rnd({37, 129}, 6, 0.05f, 4.f);
  for (int op = 0; op <= int(UnaryOp::step); ++op) {
    const UnaryOp u = UnaryOp(op);
    const bool needs_pos =
        u == UnaryOp::log || u == UnaryOp::sqrt || u == UnaryOp::rsqrt || u == UnaryOp::reciprocal;
    const Tensor& in = needs_pos ? pos : x;
    INFO("unary op " << op);
    close(gpu().unary(u, dev(in)), cpu().unary(u, in), 2e-6f, 1e-6f);
  }
  Tensor half = x.to(DType::bf16);  // inputs of other dtypes compute in f32
  close(gpu().unary(UnaryOp::exp, dev(half)), cpu().unary(UnaryOp::exp, half), 2e-6f, 0.f);
}

TEST_CASE("cuda: binary ops broadcast like the cpu", "[cuda]") {
  REQUIRE_GPU();
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{7, 13}, {7, 13}}, {{3, 1, 5}, {4, 5}}, {{1}, {6, 9}},          {{6, 9}, {}},
      {{40, 33}, {33}},   {{2, 1}, {1, 3}},    {{5, 1, 7}, {5, 3, 1}}, {{1, 4, 1, 2}, {3, 1, 5, 2}},
  };
  uint64_t seed = 10;
  for (const auto& [sa, sb] : shapes) {
    const Tensor a = rnd(sa, ++seed, 0.25f, 2.f), b = rnd(sb, ++seed, 0.25f, 2.f);
    // Small integers meet exact ties (eq, gt, max, min) and 0/0, 0^0 edge cases.
    const Tensor ia = ids(sa, ++seed, 4).to(DType::f32), ib = ids(sb, ++seed, 4).to(DType::f32);
    for (int op = 0; op <= int(BinaryOp::gt); ++op) {
      const BinaryOp o = BinaryOp(op);
      INFO("binary op " << op << " on " << sa.str() << " and " << sb.str());
      close(gpu().binary(o, dev(a), dev(b)), cpu().binary(o, a, b), 2e-6f, 1e-7f);
      close(gpu().binary(o, dev(ia), dev(ib)), cpu().binary(o, ia, ib), 2e-6f, 1e-7f);
      close(gpu().binary_scalar(o, dev(a), 1.25f), cpu().binary_scalar(o, a, 1.25f), 2e-6f, 1e-7f);
    }
  }
  CHECK_THROWS_WITH(gpu().binary(BinaryOp::add, dev(rnd({2, 3}, 1)), dev(rnd({4}, 2))),
                    Catch::Contains("cannot be broadcast"));
  CHECK_THROWS_WITH(gpu().binary(BinaryOp::add, dev(rnd({2, 3}, 1)), rnd({2, 3}, 2)),
                    Catch::Contains("was mixed with tensors on cuda:0"));
}

TEST_CASE("cuda: add_inplace accumulates in place", "[cuda]") {
  REQUIRE_GPU();
  const Tensor a = rnd({33, 65}, 20), b = rnd({33, 65}, 21);
  Tensor ga = dev(a), ca = a.clone();
  gpu().add_inplace(ga, dev(b));
  cpu().add_inplace(ca, b);
  same(ga, ca);
  Tensor gh = dev(a).to(DType::bf16), ch = a.to(DType::bf16);
  gpu().add_inplace(gh, dev(b));
  cpu().add_inplace(ch, b);
  same(gh.to(DType::f32), ch.to(DType::f32));
}

TEST_CASE("cuda: reductions and argmax match the cpu", "[cuda]") {
  REQUIRE_GPU();
  const Tensor x = rnd({5, 7, 9, 3}, 30);
  const std::vector<std::vector<int>> axes = {{}, {0}, {1}, {3}, {0, 2}, {1, 2}, {0, 1, 2, 3}};
  for (const auto& ax : axes) {
    INFO("axes " << ax.size());
    close(gpu().reduce(ReduceOp::sum, dev(x), ax), cpu().reduce(ReduceOp::sum, x, ax), 1e-5f,
          1e-5f);
    same(gpu().reduce(ReduceOp::max, dev(x), ax), cpu().reduce(ReduceOp::max, x, ax));
  }
  const Tensor big = rnd({3, 200001}, 31);  // long rows: the tree sum stays accurate
  close(gpu().reduce(ReduceOp::sum, dev(big), std::vector<int>{1}),
        cpu().reduce(ReduceOp::sum, big, std::vector<int>{1}), 1e-5f, 2e-3f);
  close(gpu().reduce(ReduceOp::sum, dev(big), std::vector<int>{0}),
        cpu().reduce(ReduceOp::sum, big, std::vector<int>{0}), 1e-6f, 1e-6f);
  // Long columns (a bias gradient's [B*T, d]): the warps of a block split R.
  for (const Tensor& col : {rnd({2, 5000, 70}, 33), rnd({4096, 768}, 34)}) {
    const std::vector<int> ax{col.rank() - 2};
    close(gpu().reduce(ReduceOp::sum, dev(col), ax), cpu().reduce(ReduceOp::sum, col, ax), 1e-6f,
          1e-6f);
    same(gpu().reduce(ReduceOp::max, dev(col), ax), cpu().reduce(ReduceOp::max, col, ax));
  }
  // Coarse values force ties: the first maximum wins on both devices.
  const Tensor t = ids({6, 11, 4}, 32, 3).to(DType::f32);
  for (int axis : {0, 1, 2, -1}) same(gpu().argmax(dev(t), axis), cpu().argmax(t, axis));
}

TEST_CASE("cuda: layout ops match the cpu for every element size", "[cuda]") {
  REQUIRE_GPU();
  for (DType dt : {DType::f32, DType::bf16, DType::i64, DType::u8}) {
    const Tensor x = rnd({4, 3, 5, 6}, 40, 0.f, 100.f).to(dt);
    const std::vector<std::vector<int>> perms = {
        {0, 1, 3, 2}, {3, 2, 1, 0}, {0, 2, 1, 3}, {1, 0, 2, 3}};
    for (const auto& p : perms) same(gpu().permute(dev(x), p), cpu().permute(x, p));
    same(gpu().broadcast_to(dev(x.slice0(0, 1)), {7, 3, 5, 6}),
         cpu().broadcast_to(x.slice0(0, 1), {7, 3, 5, 6}));
    const Tensor col = rnd({3, 1, 6}, 41).to(dt);
    same(gpu().broadcast_to(dev(col), {2, 3, 5, 6}), cpu().broadcast_to(col, {2, 3, 5, 6}));
    for (int axis = 0; axis < 4; ++axis) {
      same(gpu().slice(dev(x), axis, 1, 2), cpu().slice(x, axis, 1, 2));
      const Tensor src = rnd(x.shape().with(axis, 2), 42 + axis, 0.f, 100.f).to(dt);
      Tensor gd = dev(x), cd = x.clone();
      gpu().slice_assign(gd, dev(src), axis, 1);
      cpu().slice_assign(cd, src, axis, 1);
      same(gd.to(DType::f32), cd.to(DType::f32));
    }
  }
  CHECK_THROWS_WITH(gpu().permute(dev(rnd({2, 3}, 1)), std::vector<int>{0, 0}),
                    Catch::Contains("not a permutation"));
}

TEST_CASE("cuda: matmul matches the cpu (batched, transposed, broadcast)", "[cuda]") {
  REQUIRE_GPU();
  {
    // Large GEMMs with a row pitch off 16 bytes (an odd vocabulary, as in an LM
    // head's three GEMMs), C accumulated where asked. Sums of 4099 products
    // differ from the CPU's by rounding (cuBLAS may split K).
    const Tensor x = rnd({512, 128}, 63), w = rnd({4099, 128}, 64);
    close(gpu().matmul(dev(x), dev(w), false, true), cpu().matmul(x, w, false, true), 1e-5f, 1e-5f);
    const Tensor dl = rnd({512, 4099}, 65), c0 = rnd({4099, 128}, 66);
    Tensor gc = dev(c0), cc = c0.clone();
    gpu().matmul_into(dev(dl), dev(x), true, false, gc, true);  // dw += dl^T x
    cpu().matmul_into(dl, x, true, false, cc, true);
    close(gc, cc, 1e-5f, 1e-4f);  // K = 512
    Tensor gx = Tensor::zeros({512, 128}, DType::f32, kGpu), cx = Tensor::zeros({512, 128});
    gpu().matmul_into(dev(dl), dev(w), false, false, gx, false);  // dx = dl w
    cpu().matmul_into(dl, w, false, false, cx, false);
    close(gx, cx, 1e-5f, 1e-3f);  // K = 4099
  }
  {
    // Mixed precision: f32 operands rounded to bf16 on both devices, products
    // exact, f32 sums (the GPU's bf16 tensor cores; only the order differs).
    PrecisionGuard mixed(Precision::bf16);
    const Tensor a = rnd({3, 37, 64}, 60), b = rnd({64, 45}, 61);
    close(gpu().matmul(dev(a), dev(b), false, false), cpu().matmul(a, b, false, false), 1e-5f,
          1e-5f);
    const Tensor w = rnd({45, 64}, 62);
    Tensor gc = Tensor::zeros({111, 45}, DType::f32, kGpu), cc = Tensor::zeros({111, 45});
    gpu().matmul_into(dev(a.view({111, 64})), dev(w), false, true, gc, false);
    cpu().matmul_into(a.view({111, 64}), w, false, true, cc, false);
    close(gc, cc, 1e-5f, 1e-5f);
    // ... and the rounding happened: the f32 product differs.
    const std::vector<float> mixed_c = gpu().matmul(dev(a), dev(b), false, false).to_vector();
    PrecisionGuard full(Precision::f32);
    CHECK(gpu().matmul(dev(a), dev(b), false, false).to_vector() != mixed_c);
  }
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  const std::vector<Case> cases = {
      {{37, 29}, {29, 41}, false, false},   {{29, 37}, {29, 41}, true, false},
      {{37, 29}, {41, 29}, false, true},    {{29, 37}, {41, 29}, true, true},
      {{3, 5, 7}, {3, 7, 4}, false, false}, {{2, 1, 5, 6}, {3, 6, 4}, false, false},
      {{4, 5, 6}, {6, 3}, false, false},    {{4, 6, 5}, {3, 6}, true, true},
      {{5, 6}, {2, 3, 6, 4}, false, false}, {{2, 1, 3, 4}, {1, 5, 4, 2}, false, false},
  };
  uint64_t seed = 50;
  for (const auto& c : cases) {
    const Tensor a = rnd(c.a, ++seed), b = rnd(c.b, ++seed);
    INFO(c.a.str() << " x " << c.b.str() << " ta=" << c.ta << " tb=" << c.tb);
    close(gpu().matmul(dev(a), dev(b), c.ta, c.tb), cpu().matmul(a, b, c.ta, c.tb), 1e-5f, 1e-4f);
    const Tensor ha = a.to(DType::bf16), hb = b.to(DType::bf16);  // bf16 in, fp32 accumulate
    close(gpu().matmul(dev(ha), dev(hb), c.ta, c.tb), cpu().matmul(ha, hb, c.ta, c.tb), 1e-5f,
          1e-4f);
  }
  const Tensor empty_k =
      gpu().matmul(dev(Tensor::zeros({3, 0})), dev(Tensor::zeros({0, 4})), false, false);
  CHECK(empty_k.to(Device::cpu()).to_vector() == std::vector<float>(12, 0.f));
  const Tensor a = rnd({64, 256}, 60), b = rnd({256, 48}, 61);
  cuda::set_allow_tf32(true);
  const Tensor tf32 = gpu().matmul(dev(a), dev(b), false, false);
  cuda::set_allow_tf32(false);
  close(tf32, cpu().matmul(a, b, false, false), 1e-2f, 5e-2f);
  CHECK_THROWS_WITH(gpu().matmul(dev(a), dev(a), false, false), Catch::Contains("do not match"));
}

TEST_CASE("cuda: softmax family matches the cpu", "[cuda]") {
  REQUIRE_GPU();
  for (const Shape& s : {Shape{3}, Shape{17, 1000}, Shape{2, 3, 5001}}) {
    const Tensor x = rnd(s, 70, -30.f, 30.f), dy = rnd(s, 71);
    const Tensor y = cpu().softmax(x), ly = cpu().log_softmax(x);
    close(gpu().softmax(dev(x)), y, 1e-5f, 1e-7f);
    close(gpu().log_softmax(dev(x)), ly, 1e-5f, 1e-5f);
    close(gpu().softmax_backward(dev(y), dev(dy)), cpu().softmax_backward(y, dy), 1e-4f, 1e-6f);
    close(gpu().log_softmax_backward(dev(ly), dev(dy)), cpu().log_softmax_backward(ly, dy), 1e-4f,
          1e-5f);
  }
}

TEST_CASE("cuda: layer norm and rms norm match the cpu", "[cuda]") {
  REQUIRE_GPU();
  const Tensor x = cpu().binary_scalar(BinaryOp::add, rnd({130, 257}, 80), 50.f);  // large mean
  const Tensor g = rnd({257}, 81), b = rnd({257}, 82), dy = rnd({130, 257}, 83);
  for (bool with_beta : {true, false}) {
    LayerNormSaved cs, gs;
    const Tensor cb = with_beta ? b : Tensor(), gb = with_beta ? dev(b) : Tensor();
    close(gpu().layer_norm(dev(x), dev(g), gb, 1e-5f, gs), cpu().layer_norm(x, g, cb, 1e-5f, cs),
          1e-4f, 1e-4f);
    close(gs.mean, cs.mean, 1e-6f, 1e-6f);
    close(gs.rstd, cs.rstd, 1e-4f, 0.f);
    const TensorList gg = gpu().layer_norm_backward(dev(dy), dev(x), dev(g), with_beta, gs);
    const TensorList cg = cpu().layer_norm_backward(dy, x, g, with_beta, cs);
    REQUIRE(gg.size() == cg.size());
    for (size_t i = 0; i < cg.size(); ++i) {
      REQUIRE(gg[i].defined() == cg[i].defined());
      if (cg[i].defined()) close(gg[i], cg[i], 1e-3f, 1e-3f);
    }
  }
  LayerNormSaved cs, gs;
  const Tensor xs = rnd({130, 257}, 84);
  close(gpu().rms_norm(dev(xs), dev(g), 1e-6f, gs), cpu().rms_norm(xs, g, 1e-6f, cs), 1e-5f, 1e-5f);
  const TensorList gg = gpu().rms_norm_backward(dev(dy), dev(xs), dev(g), gs);
  const TensorList cg = cpu().rms_norm_backward(dy, xs, g, cs);
  REQUIRE(gg.size() == cg.size());
  for (size_t i = 0; i < cg.size(); ++i) close(gg[i], cg[i], 1e-4f, 1e-4f);
}

TEST_CASE("cuda: group norm and nearest upsampling match the cpu", "[cuda]") {
  REQUIRE_GPU();
  // 3 samples, 12 channels in 4 groups, 7x9 pixels; a large mean tests the two-pass variance.
  const Tensor x = cpu().binary_scalar(BinaryOp::add, rnd({3, 12, 7, 9}, 90), 30.f);
  const Tensor g = rnd({12}, 91), b = rnd({12}, 92), dy = rnd({3, 12, 7, 9}, 93);
  for (bool with_beta : {true, false}) {
    LayerNormSaved cs, gs;
    const Tensor cb = with_beta ? b : Tensor(), gb = with_beta ? dev(b) : Tensor();
    close(gpu().group_norm(dev(x), dev(g), gb, 4, 1e-5f, gs),
          cpu().group_norm(x, g, cb, 4, 1e-5f, cs), 1e-4f, 1e-4f);
    close(gs.mean, cs.mean, 1e-6f, 1e-5f);
    close(gs.rstd, cs.rstd, 1e-4f, 0.f);
    const TensorList gg = gpu().group_norm_backward(dev(dy), dev(x), dev(g), 4, with_beta, gs);
    const TensorList cg = cpu().group_norm_backward(dy, x, g, 4, with_beta, cs);
    REQUIRE(gg.size() == cg.size());
    for (size_t i = 0; i < cg.size(); ++i) {
      REQUIRE(gg[i].defined() == cg[i].defined());
      if (cg[i].defined()) close(gg[i], cg[i], 1e-3f, 1e-3f);
    }
  }
  const Tensor img = rnd({2, 3, 5, 4}, 94);
  same(gpu().upsample_nearest2d(dev(img), 3), cpu().upsample_nearest2d(img, 3));
  const Tensor dup = rnd({2, 3, 15, 12}, 95);
  close(gpu().upsample_nearest2d_backward(dev(dup), 3), cpu().upsample_nearest2d_backward(dup, 3),
        1e-6f, 1e-6f);
}

TEST_CASE("cuda: gelu and silu match the cpu", "[cuda]") {
  REQUIRE_GPU();
  const Tensor x = rnd({1001, 3}, 90, -12.f, 12.f), dy = rnd({1001, 3}, 91);
  for (bool approx : {true, false}) {
    close(gpu().gelu(dev(x), approx), cpu().gelu(x, approx), 1e-5f, 1e-6f);
    close(gpu().gelu_backward(dev(x), dev(dy), approx), cpu().gelu_backward(x, dy, approx), 1e-5f,
          1e-6f);
  }
  close(gpu().silu(dev(x)), cpu().silu(x), 1e-5f, 1e-6f);
  close(gpu().silu_backward(dev(x), dev(dy)), cpu().silu_backward(x, dy), 1e-5f, 1e-6f);
}

TEST_CASE("cuda: cross entropy matches the cpu", "[cuda]") {
  REQUIRE_GPU();
  const Tensor logits = rnd({4, 9, 1003}, 100, -10.f, 10.f);
  Tensor labels = ids({4, 9}, 101, 1003);
  labels.data<int64_t>()[5] = labels.data<int64_t>()[20] = -100;  // ignored rows
  Tensor clse, glse;
  const Tensor closs = cpu().cross_entropy(logits, labels, -100, clse);
  close(gpu().cross_entropy(dev(logits), dev(labels), -100, glse), closs, 1e-5f, 1e-5f);
  close(glse, clse, 1e-6f, 1e-5f);
  const Tensor dl = rnd({4, 9}, 102);
  close(gpu().cross_entropy_backward(dev(logits), dev(labels), glse, dev(dl), -100, false),
        cpu().cross_entropy_backward(logits, labels, clse, dl, -100, false), 1e-4f, 1e-7f);
  labels.data<int64_t>()[7] = 1003;
  CHECK_THROWS_WITH(gpu().cross_entropy(dev(logits), dev(labels), -100, glse),
                    Catch::Contains("row 7 has label 1003"));
}

TEST_CASE("cuda: embedding matches the cpu bitwise", "[cuda]") {
  REQUIRE_GPU();
  const Tensor table = rnd({50, 33}, 110);
  for (int64_t n : {int64_t(7), int64_t(3000)}) {  // tiny and sorted-path sizes on the CPU
    const Tensor i = ids({n}, 111 + uint64_t(n), 50), dout = rnd({n, 33}, 112);
    same(gpu().embedding(dev(table), dev(i)), cpu().embedding(table, i));
    same(gpu().embedding_backward(dev(dout), dev(i), 50, Tensor()),
         cpu().embedding_backward(dout, i, 50, Tensor()));
    // Onto a gradient summed so far (in place; the sums may round differently).
    const Tensor so_far = rnd({50, 33}, 114);
    const Tensor on_gpu = dev(so_far);
    const Tensor got = gpu().embedding_backward(dev(dout), dev(i), 50, on_gpu);
    CHECK(got.shares_storage_with(on_gpu));
    close(got, cpu().embedding_backward(dout, i, 50, so_far.clone()), 1e-5f, 1e-5f);
  }
  Tensor bad = ids({9}, 113, 50);
  bad.data<int64_t>()[4] = 50;
  CHECK_THROWS_WITH(gpu().embedding(dev(table), dev(bad)), Catch::Contains("id 50 at position 4"));
}

TEST_CASE("cuda: dropout masks and rotary match the cpu", "[cuda]") {
  REQUIRE_GPU();
  for (float p : {0.f, 0.1f, 0.5f}) {
    const Tensor g = gpu().dropout_mask({33, 71}, p, 1234, 99);
    same(g, cpu().dropout_mask({33, 71}, p, 1234, 99));  // same Philox draw, same mask
  }
  const Tensor x = rnd({2, 3, 17, 16}, 120);
  for (bool inverse : {false, true}) {
    close(gpu().rotary(dev(x), 5000, 10000.f, inverse), cpu().rotary(x, 5000, 10000.f, inverse),
          1e-5f, 1e-5f);
  }
}

// Attention against the CPU's flash kernel: causal and not, grouped-query
// heads, Tq < Tk (a KV cache), per-row key ranges and causal offsets, and a
// shared or per-row bias (T5), forward and backward.
// bf16 operands (mixed precision) take the GPU's TF32 GEMMs: P and dS lose
// bits there, hence the wider tolerance.
void attention_matches_cpu(const Shape& qs, const Shape& ks, bool causal, const AttentionExtras& cx,
                           DType dt = DType::f32) {
  const float rtol = dt == DType::f32 ? 1e-3f : 1e-2f, atol = dt == DType::f32 ? 1e-4f : 2e-3f;
  const Tensor q = rnd(qs, 140).to(dt), k = rnd(ks, 141).to(dt), v = rnd(ks, 142).to(dt);
  const Tensor dout = rnd(qs, 143);
  const float scale = 1.f / std::sqrt(float(qs[3]));
  AttentionExtras gx = cx;
  if (cx.bias.defined()) gx.bias = dev(cx.bias);
  Tensor clse, glse;
  const Tensor co = cpu().attention(q, k, v, causal, scale, clse, cx);
  const Tensor go = gpu().attention(dev(q), dev(k), dev(v), causal, scale, glse, gx);
  close(go, co, rtol / 10, atol / 10);
  close(glse, clse, rtol / 100, atol / 10);
  const TensorList cg = cpu().attention_backward(q, k, v, co, clse, dout, causal, scale, cx);
  const TensorList gg =
      gpu().attention_backward(dev(q), dev(k), dev(v), go, glse, dev(dout), causal, scale, gx);
  REQUIRE(gg.size() == cg.size());
  for (size_t i = 0; i < cg.size(); ++i) close(gg[i], cg[i], rtol, atol);
}

TEST_CASE("cuda: attention matches the cpu", "[cuda]") {
  REQUIRE_GPU();
  for (bool causal : {true, false}) {
    attention_matches_cpu({2, 4, 37, 16}, {2, 4, 37, 16}, causal, {});
    attention_matches_cpu({2, 6, 5, 8}, {2, 2, 70, 8}, causal, {});  // GQA, Tq < Tk
  }
  AttentionExtras rows;  // left padding, and each row's queries at their own positions
  rows.key_begin = Tensor::from<int64_t>(std::vector<int64_t>{3, 0}, {2});
  rows.key_end = Tensor::from<int64_t>(std::vector<int64_t>{40, 31}, {2});
  rows.causal_offset = Tensor::from<int64_t>(std::vector<int64_t>{36, 27}, {2});
  attention_matches_cpu({2, 4, 4, 16}, {2, 2, 40, 16}, true, rows);
  AttentionExtras shared, per_row;
  shared.bias = rnd({3, 9, 11}, 144);
  per_row.bias = rnd({2, 3, 9, 11}, 145);
  attention_matches_cpu({2, 3, 9, 8}, {2, 3, 11, 8}, false, shared);
  attention_matches_cpu({2, 3, 9, 8}, {2, 3, 11, 8}, true, per_row);
  attention_matches_cpu({1, 2, 1024, 64}, {1, 2, 1024, 64}, true, {});  // GPT-2's rows
  attention_matches_cpu({2, 4, 37, 16}, {2, 4, 37, 16}, true, {}, DType::bf16);
  attention_matches_cpu({2, 6, 5, 8}, {2, 2, 70, 8}, false, {}, DType::bf16);
}

// The flash kernels (flash_attention*.cu), opted into with
// REDCO_CUDA_ATTENTION=flash, on bf16 operands: o within bf16 rounding of P,
// lse as exact as the GEMM path's; the backward (its own kernels at head size
// 64, the GEMM path's at 128) from the flash o and lse, within bf16 rounding of
// dO, P and dS. Each result must also differ from the GEMM path's: the flash
// path was taken.
void flash_matches_cpu(const Shape& qs, const Shape& ks, bool causal, const AttentionExtras& cx) {
  const Tensor q = rnd(qs, 180).to(DType::bf16), k = rnd(ks, 181).to(DType::bf16);
  const Tensor v = rnd(ks, 182).to(DType::bf16), dout = rnd(qs, 183);
  const float scale = 1.f / std::sqrt(float(qs[3]));
  const Tensor gq = dev(q), gk = dev(k), gv = dev(v), gdout = dev(dout);
  Tensor clse, glse, gemm_lse;
  const Tensor co = cpu().attention(q, k, v, causal, scale, clse, cx);
  const Tensor gemm_o = gpu().attention(gq, gk, gv, causal, scale, gemm_lse, cx);
  const TensorList gemm_g =
      gpu().attention_backward(gq, gk, gv, gemm_o, gemm_lse, gdout, causal, scale, cx);
  setenv("REDCO_CUDA_ATTENTION", "flash", 1);
  const Tensor go = gpu().attention(gq, gk, gv, causal, scale, glse, cx);
  const TensorList gg = gpu().attention_backward(gq, gk, gv, go, glse, gdout, causal, scale, cx);
  unsetenv("REDCO_CUDA_ATTENTION");
  CHECK(go.to_vector() != gemm_o.to_vector());
  close(go, co, 1e-2f, 4e-3f);
  close(glse, clse, 1e-5f, 1e-4f);
  const TensorList cg = cpu().attention_backward(q, k, v, co, clse, dout, causal, scale, cx);
  for (size_t i = 0; i < cg.size(); ++i) {
    // The gradients' rounding error scales with their largest terms: within
    // 1.5% of max |cpu| (a lane-by-lane emulation of the kernels: at most 0.63%).
    const std::vector<float> a = gg[i].to_vector(), c = cg[i].to_vector();
    float scale_of = 0, worst = 0;
    for (size_t j = 0; j < c.size(); ++j) scale_of = std::max(scale_of, std::fabs(c[j]));
    for (size_t j = 0; j < c.size(); ++j) worst = std::max(worst, std::fabs(a[j] - c[j]));
    INFO("gradient " << i << ": worst |diff| " << worst << ", max |cpu| " << scale_of);
    CHECK(worst <= 1.5e-2f * scale_of);
    if (qs[3] == 64) CHECK(a != gemm_g[i].to_vector());
  }
}

TEST_CASE("cuda: flash attention matches the cpu", "[cuda]") {
  REQUIRE_GPU();
  for (bool causal : {true, false}) {
    flash_matches_cpu({2, 4, 37, 64}, {2, 4, 37, 64}, causal, {});      // one partial tile
    flash_matches_cpu({2, 6, 5, 64}, {2, 2, 130, 64}, causal, {});      // GQA, Tq < Tk
    flash_matches_cpu({1, 2, 130, 128}, {1, 2, 130, 128}, causal, {});  // D 128
  }
  flash_matches_cpu({1, 2, 1024, 64}, {1, 2, 1024, 64}, true, {});  // GPT-2's rows
  AttentionExtras rows;  // left padding, each row's queries at their own positions
  rows.key_begin = Tensor::from<int64_t>(std::vector<int64_t>{3, 0}, {2});
  rows.key_end = Tensor::from<int64_t>(std::vector<int64_t>{70, 61}, {2});
  rows.causal_offset = Tensor::from<int64_t>(std::vector<int64_t>{66, 57}, {2});
  flash_matches_cpu({2, 4, 4, 64}, {2, 2, 70, 64}, true, rows);
}

TEST_CASE("cuda: convolution and pooling match the cpu", "[cuda]") {
  REQUIRE_GPU();
  const Tensor x = rnd({3, 4, 11, 9}, 150), w = rnd({5, 4, 3, 3}, 151), b = rnd({5}, 152);
  for (auto [stride, pad] : {std::pair<int64_t, int64_t>{1, 1}, {2, 0}, {2, 2}}) {
    const Tensor cy = cpu().conv2d(x, w, b, stride, pad);
    close(gpu().conv2d(dev(x), dev(w), dev(b), stride, pad), cy, 1e-4f, 1e-4f);
    const Tensor dy = rnd(cy.shape(), 153);
    const TensorList cg = cpu().conv2d_backward(dy, x, w, true, stride, pad);
    const TensorList gg = gpu().conv2d_backward(dev(dy), dev(x), dev(w), true, stride, pad);
    for (size_t i = 0; i < cg.size(); ++i) close(gg[i], cg[i], 1e-3f, 1e-3f);
  }
  // Overlapping windows (stride < k) and ties (a constant block) for the argmax rule.
  Tensor img = rnd({2, 3, 9, 8}, 154);
  img.data<float>()[0] = img.data<float>()[1] = img.data<float>()[8] = 5.f;
  for (auto [k, stride] : {std::pair<int64_t, int64_t>{2, 2}, {3, 1}, {3, 2}}) {
    Tensor ca, ga;
    const Tensor cy = cpu().max_pool2d(img, k, stride, ca);
    same(gpu().max_pool2d(dev(img), k, stride, ga), cy);
    CHECK(ga.to(Device::cpu()).values<int32_t>() == ca.values<int32_t>());
    const Tensor dy = rnd(cy.shape(), 155);
    close(gpu().max_pool2d_backward(dev(dy), ga, img.shape(), k, stride),
          cpu().max_pool2d_backward(dy, ca, img.shape(), k, stride), 1e-6f, 1e-6f);
    same(gpu().max_pool2d_gather(dev(img), ga), cpu().max_pool2d_gather(img, ca));
    close(gpu().avg_pool2d(dev(img), k, stride), cpu().avg_pool2d(img, k, stride), 1e-6f, 1e-6f);
    close(gpu().avg_pool2d_backward(dev(dy), img.shape(), k, stride),
          cpu().avg_pool2d_backward(dy, img.shape(), k, stride), 1e-6f, 1e-6f);
  }
}

// linear -> gelu -> layer_norm -> linear -> log-softmax NLL, differentiated by
// the autodiff engine on each device.
TensorList model_grads(Device d, float* loss_out) {
  Tensor x = rnd({12, 16}, 140).to(d), onehot = Tensor::zeros({12, 10});
  const Tensor lab = ids({12}, 141, 10);
  for (int64_t r = 0; r < 12; ++r) onehot.data<float>()[r * 10 + lab.data<int64_t>()[r]] = 1.f;
  TensorList params = {rnd({32, 16}, 142, -0.5f, 0.5f), rnd({32}, 143), rnd({32}, 144),
                       rnd({32}, 145), rnd({10, 32}, 146, -0.5f, 0.5f)};
  for (Tensor& p : params) p = p.to(d).set_requires_grad();
  const Tensor h = layer_norm(gelu(linear(x, params[0], params[1])), params[2], params[3]);
  const Tensor logp = log_softmax(linear(h, params[4]));
  const Tensor loss = mul(sum(mul(logp, onehot.to(d))), -1.f / 12.f);
  *loss_out = loss.to(Device::cpu()).item();
  return grad({loss}, params, {Tensor::ones({}).to(d)});
}

TEST_CASE("cuda: autodiff through a small model matches the cpu", "[cuda]") {
  REQUIRE_GPU();
  float lc = 0, lg = 0;
  const TensorList gc = model_grads(Device::cpu(), &lc), gg = model_grads(kGpu, &lg);
  CHECK(lg == Approx(lc).epsilon(1e-5));
  REQUIRE(gg.size() == gc.size());
  for (size_t i = 0; i < gc.size(); ++i) close(gg[i], gc[i], 1e-3f, 1e-5f);
}

// The fused LM head and its loss: on the GPU an odd vocabulary is padded for
// the GEMMs (ops_lm_head.cpp); loss and gradients must be the CPU's, in f32
// and under bf16, over several chunks, with ignored labels.
TEST_CASE("cuda: linear_cross_entropy with an odd vocabulary matches the cpu", "[cuda]") {
  REQUIRE_GPU();
  for (Precision p : {Precision::f32, Precision::bf16}) {
    PrecisionGuard guard(p);
    Tensor labels = ids({70}, 151, 1001);
    labels.data<int64_t>()[5] = -100;
    auto run = [&](Device d, float* loss_out) {
      Tensor x = rnd({70, 48}, 152).to(d).set_requires_grad();
      Tensor w = rnd({1001, 48}, 153).to(d).set_requires_grad();
      const Tensor loss = linear_cross_entropy(x, w, labels.to(d), -100, 32);
      *loss_out = loss.to(Device::cpu()).item();
      return grad({loss}, {x, w}, {Tensor::ones({}).to(d)});
    };
    float lc = 0, lg = 0;
    const TensorList gc = run(Device::cpu(), &lc), gg = run(kGpu, &lg);
    CHECK(lg == Approx(lc).epsilon(1e-5));
    for (size_t i = 0; i < gc.size(); ++i) close(gg[i], gc[i], 1e-4f, 1e-6f);
  }
}

}  // namespace
}  // namespace redco
