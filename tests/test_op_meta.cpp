// The op list's meta functions (redco/ops/meta.hpp): every op rejects bad
// arguments at its `kernels::` entry point, with one message whatever the
// device, before any backend runs.
#include <catch2/catch.hpp>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "redco/ops/backend.hpp"

using namespace redco;

namespace {

// A backend that only counts the calls that reach it: installed for the test
// device, it proves that a rejected call never got as far as a kernel.
class CountingBackend final : public Backend {
 public:
  int calls = 0;
  template <typename... A>
  static void read(const A&...) {}
#define REDCO_COUNT_OP(ret, name, params, args) \
  ret name params override {                    \
    read args;                                  \
    ++calls;                                    \
    return ret();                               \
  }
  REDCO_OPS(REDCO_COUNT_OP)
#undef REDCO_COUNT_OP
};

// Installs a backend for the test device for one scope.
struct Installed {
  Backend* before;
  explicit Installed(Backend& b) : before(&backend(Device::test())) {
    register_backend(DeviceKind::test, &b);
  }
  ~Installed() { register_backend(DeviceKind::test, before); }
};

struct Case {
  const char* op;
  std::string expect;                // a fragment of the message
  std::function<void(Device)> call;  // the bad call, its tensors made on the device
};

Tensor f(const Shape& s, Device d) { return Tensor::zeros(s, DType::f32, d); }
Tensor ids(const Shape& s, Device d) { return Tensor::zeros(s, DType::i64, d); }

std::vector<Case> bad_calls() {
  using K = std::function<void(Device)>;
  std::vector<Case> c;
  auto add = [&](const char* op, std::string expect, K call) {
    c.push_back({op, std::move(expect), std::move(call)});
  };
  const int ax01[] = {1, 0}, perm00[] = {0, 0};
  add("unary", "unary: an input tensor is undefined",
      [](Device) { kernels::unary(UnaryOp::exp, Tensor()); });
  add("binary", "add: shapes [2, 3] and [4]", [](Device d) {
    kernels::binary(BinaryOp::add, f({2, 3}, d), f({4}, d));
  });
  add("binary_scalar", "an input tensor is undefined",
      [](Device) { kernels::binary_scalar(BinaryOp::mul, Tensor(), 2.f); });
  add("add_inplace", "add_inplace: shapes [2] and [3]", [](Device d) {
    Tensor a = f({2}, d);
    kernels::add_inplace(a, f({3}, d));
  });
  add("reduce", "axes must be sorted", [=](Device d) {
    kernels::reduce(ReduceOp::sum, f({2, 3}, d), ax01);
  });
  add("argmax", "argmax: axis 1 of shape [2, 0] is empty", [](Device d) {
    kernels::argmax(f({2, 0}, d), 1);
  });
  add("broadcast_to", "shape [3, 2] cannot be broadcast to [3, 4]", [](Device d) {
    kernels::broadcast_to(f({3, 2}, d), {3, 4});
  });
  add("permute", "(0, 0) is not a permutation", [=](Device d) {
    kernels::permute(f({2, 3}, d), perm00);
  });
  add("slice", "slice: [2, 4) is out of range for axis 0 of shape [3, 4]", [](Device d) {
    kernels::slice(f({3, 4}, d), 0, 2, 2);
  });
  add("slice_assign", "overruns destination [3, 4]", [](Device d) {
    Tensor dst = f({3, 4}, d);
    kernels::slice_assign(dst, f({3, 2}, d), 1, 3);
  });
  add("matmul", "op(a) has K = 7 but op(b) has K = 6", [](Device d) {
    kernels::matmul(f({2, 5, 7}, d), f({6, 3}, d), false, false);
  });
  add("matmul_into", "does not fit the result [5, 4]", [](Device d) {
    Tensor out = f({5, 4}, d);
    kernels::matmul_into(f({5, 7}, d), f({7, 3}, d), false, false, out, false);
  });
  add("softmax", "softmax: the last dim of [3, 0] is empty", [](Device d) {
    kernels::softmax(f({3, 0}, d));
  });
  add("softmax_backward", "softmax backward: shapes [2, 3] and [3, 2]", [](Device d) {
    kernels::softmax_backward(f({2, 3}, d), f({3, 2}, d));
  });
  add("log_softmax", "log_softmax: expected a floating tensor, got i64", [](Device d) {
    kernels::log_softmax(ids({2, 3}, d));
  });
  add("log_softmax_backward", "log_softmax backward: shapes [4] and [5]",
      [](Device d) { kernels::log_softmax_backward(f({4}, d), f({5}, d)); });
  add("layer_norm", "layer_norm: gamma has shape [3] but the input [2, 4] needs [4]", [](Device d) {
    LayerNormSaved s;
    kernels::layer_norm(f({2, 4}, d), f({3}, d), Tensor(), 1e-5f, s);
  });
  add("layer_norm_backward", "are not a layer norm's", [](Device d) {
    kernels::layer_norm_backward(f({2, 4}, d), f({2, 4}, d), f({4}, d), true,
                                 LayerNormSaved{Tensor(), f({2}, d)});
  });
  add("rms_norm", "rms_norm: gamma has shape [5]", [](Device d) {
    LayerNormSaved s;
    kernels::rms_norm(f({2, 4}, d), f({5}, d), 1e-5f, s);
  });
  add("rms_norm_backward", "are not a RMS norm's", [](Device d) {
    kernels::rms_norm_backward(f({2, 4}, d), f({2, 4}, d), f({4}, d),
                               LayerNormSaved{f({2}, d), f({2}, d)});
  });
  add("gelu", "gelu: expected a floating tensor",
      [](Device d) { kernels::gelu(ids({3}, d), false); });
  add("gelu_backward", "gelu backward: shapes [3] and [4]",
      [](Device d) { kernels::gelu_backward(f({3}, d), f({4}, d), true); });
  add("silu", "silu: expected a floating tensor", [](Device d) { kernels::silu(ids({3}, d)); });
  add("silu_backward", "silu backward: shapes [3] and [2]",
      [](Device d) { kernels::silu_backward(f({3}, d), f({2}, d)); });
  add("cross_entropy", "logits [4, 10] need 4 labels (one per row), got labels [3]", [](Device d) {
    Tensor lse;
    kernels::cross_entropy(f({4, 10}, d), ids({3}, d), -100, lse);
  });
  add("cross_entropy_backward", "cross_entropy: indices must be i64, got f32", [](Device d) {
    kernels::cross_entropy_backward(f({4, 10}, d), f({4}, d), f({4}, d), f({4}, d), -100, false);
  });
  add("embedding", "embedding: the table must be [vocab, dim], got [10]",
      [](Device d) { kernels::embedding(f({10}, d), ids({3}, d)); });
  add("embedding_backward", "cannot accumulate into", [](Device d) {
    kernels::embedding_backward(f({3, 4}, d), ids({3}, d), 10, f({10, 5}, d));
  });
  add("rotary", "with an even head_dim, got [1, 2, 3, 5]", [](Device d) {
    kernels::rotary(f({1, 2, 3, 5}, d), 0, 10000.f, false);
  });
  add("attention", "with Hq a multiple of Hkv", [](Device d) {
    Tensor lse;
    kernels::attention(f({1, 3, 2, 4}, d), f({1, 2, 2, 4}, d), f({1, 2, 2, 4}, d), true, 0.5f, lse,
                       {});
  });
  add("attention_backward", "a paged KV cache serves inference only", [](Device d) {
    AttentionExtras x;
    x.block_table = Tensor::zeros({1, 1}, DType::i64);
    const Tensor q = f({1, 2, 2, 4}, d);
    kernels::attention_backward(q, q, q, q, f({1, 2, 2}, d), q, true, 0.5f, x);
  });
  add("conv2d", "kernel 5x5 (stride 1, pad 0) does not fit the input [1, 2, 3, 3]", [](Device d) {
    kernels::conv2d(f({1, 2, 3, 3}, d), f({4, 2, 5, 5}, d), Tensor(), 1, 0);
  });
  add("conv2d_backward", "conv2d backward: gradient [1, 4, 2, 2] does not match", [](Device d) {
    kernels::conv2d_backward(f({1, 4, 2, 2}, d), f({1, 2, 3, 3}, d), f({4, 2, 1, 1}, d), false, 1,
                             0);
  });
  add("max_pool2d", "max_pool2d: expected x [N, C, H, W] at least 4x4", [](Device d) {
    Tensor arg;
    kernels::max_pool2d(f({1, 1, 3, 3}, d), 4, 4, arg);
  });
  add("max_pool2d_backward", "must both be the pooled shape of [1, 1, 4, 4]", [](Device d) {
    kernels::max_pool2d_backward(f({1, 1, 2, 2}, d), Tensor::zeros({1, 1, 3, 3}, DType::i32, d),
                                 Shape{1, 1, 4, 4}, 2, 2);
  });
  add("max_pool2d_gather", "does not match the pooled indices", [](Device d) {
    kernels::max_pool2d_gather(f({1, 2, 4, 4}, d), Tensor::zeros({1, 1, 2, 2}, DType::i32, d));
  });
  add("avg_pool2d", "avg_pool2d: expected x [N, C, H, W]", [](Device d) {
    kernels::avg_pool2d(f({1, 3, 3}, d), 2, 2);
  });
  add("avg_pool2d_backward", "does not match the pooled shape of [1, 1, 4, 4]", [](Device d) {
    kernels::avg_pool2d_backward(f({1, 1, 3, 3}, d), Shape{1, 1, 4, 4}, 2, 2);
  });
  add("group_norm", "divisible by the 4 groups", [](Device d) {
    LayerNormSaved s;
    kernels::group_norm(f({2, 6, 3}, d), f({6}, d), Tensor(), 4, 1e-5f, s);
  });
  add("group_norm_backward", "saved statistics must be the forward pass's", [](Device d) {
    kernels::group_norm_backward(f({2, 6, 3}, d), f({2, 6, 3}, d), f({6}, d), 3, true,
                                 LayerNormSaved{f({5}, d), f({5}, d)});
  });
  add("upsample_nearest2d", "the factor must be >= 1, got 0", [](Device d) {
    kernels::upsample_nearest2d(f({1, 1, 2, 2}, d), 0);
  });
  add("upsample_nearest2d_backward", "is not a 2x upsampled image", [](Device d) {
    kernels::upsample_nearest2d_backward(f({1, 1, 3, 4}, d), 2);
  });
  add("sgd_update", "sgd_update: the gradient has shape [3] but the parameter has [4]",
      [](Device d) {
        Tensor p = f({4}, d), buf;
        kernels::sgd_update(p, f({3}, d), buf, SgdCoeffs{});
      });
  add("adam_update", "adam_update: the second moment must be an f32 tensor, got bf16",
      [](Device d) {
        Tensor p = f({4}, d), m = f({4}, d), v = Tensor::zeros({4}, DType::bf16, d);
        kernels::adam_update(p, f({4}, d), m, v, AdamCoeffs{});
      });
  add("sum_of_squares", "sum_of_squares: the input must be an f32 tensor, got i64",
      [](Device d) { kernels::sum_of_squares(ids({4}, d)); });
  add("dropout_mask", "dropout: probability must be in [0, 1), got 1",
      [](Device d) { kernels::dropout_mask({4}, 1.f, 1, 2, d); });
  return c;
}

std::string message_of(const Case& c, Device d) {
  try {
    c.call(d);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("meta: every op of the list rejects a bad call before any backend runs", "[meta]") {
  std::set<std::string> covered;
  CountingBackend counting;
  for (const Case& c : bad_calls()) {
    INFO("op " << c.op);
    covered.insert(c.op);
    const std::string on_cpu = message_of(c, Device::cpu());
    CHECK_THAT(on_cpu, Catch::Contains(c.expect));
    // The test device's own kernels are the CPU's on host aliases; the
    // message is the same because it comes from the op's meta function.
    CHECK(message_of(c, Device::test()) == on_cpu);
    {
      Installed swap(counting);
      CHECK(message_of(c, Device::test()) == on_cpu);
    }
    CHECK(counting.calls == 0);
  }
  // Every op of the list has its case: a new op comes with one.
  std::set<std::string> ops;
#define REDCO_OP_NAME(ret, name, params, args) ops.insert(#name);
  REDCO_OPS(REDCO_OP_NAME)
#undef REDCO_OP_NAME
  CHECK(covered == ops);
}

TEST_CASE("meta: valid calls reach the backend once", "[meta]") {
  CountingBackend counting;
  const Tensor x = Tensor::zeros({2, 3}, DType::f32, Device::test());
  const int axes[] = {1};
  Installed swap(counting);
  kernels::reduce(ReduceOp::sum, x, axes);
  kernels::matmul(x, x, false, true);
  LayerNormSaved s;
  kernels::layer_norm(x, Tensor::zeros({3}, DType::f32, Device::test()), Tensor(), 1e-5f, s);
  CHECK(counting.calls == 3);
}

TEST_CASE("meta: the result shapes the backends allocate by", "[meta]") {
  CHECK(meta::matmul_shape({4, 1, 2, 3}, {5, 3, 6}, false, false) == Shape{4, 5, 2, 6});
  CHECK(meta::matmul_shape({3, 2}, {6, 3}, true, true) == Shape{2, 6});
  CHECK(meta::conv2d_shape({1, 2, 7, 9}, {4, 2, 3, 3}, 2, 1) == Shape{1, 4, 4, 5});
  CHECK(meta::pooled_shape({2, 3, 7, 7}, 3, 2) == Shape{2, 3, 3, 3});
  const int axes[] = {0, 2, 3};
  const auto p = meta::reduce_passes({2, 3, 4, 5}, axes);
  REQUIRE(p.count == 2);  // the run {2, 3} first, then {0}
  CHECK(p.pass[0].outer == 6);
  CHECK(p.pass[0].reduced == 20);
  CHECK(p.pass[0].inner == 1);
  CHECK(p.pass[0].out == Shape{2, 3, 1, 1});
  CHECK(p.pass[1].outer == 1);
  CHECK(p.pass[1].reduced == 2);
  CHECK(p.pass[1].inner == 3);
  CHECK(p.pass[1].out == Shape{1, 3, 1, 1});
}
