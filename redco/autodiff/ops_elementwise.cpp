// Elementwise differentiable ops, each forward next to its gradient rule.
// Rules are written with differentiable ops so that they can be
// differentiated again (create_graph).
#include <cmath>
#include <numbers>

#include "redco/autodiff/recording.hpp"
#include "redco/ops/backend.hpp"

namespace redco {
using detail::record_with_output;
using detail::unbroadcast;

// ---- binary, with numpy broadcasting ---------------------------------------------
Tensor add(const Tensor& a, const Tensor& b) {
  return record("add", {a, b}, kernels::binary(BinaryOp::add, a, b),
                [sa = a.shape(), sb = b.shape()](const Node& self, const TensorList& g) {
                  return TensorList{self.needs_grad(0) ? unbroadcast(g[0], sa) : Tensor(),
                                    self.needs_grad(1) ? unbroadcast(g[0], sb) : Tensor()};
                });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  return record("sub", {a, b}, kernels::binary(BinaryOp::sub, a, b),
                [sa = a.shape(), sb = b.shape()](const Node& self, const TensorList& g) {
                  return TensorList{self.needs_grad(0) ? unbroadcast(g[0], sa) : Tensor(),
                                    self.needs_grad(1) ? unbroadcast(neg(g[0]), sb) : Tensor()};
                });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  return record("mul", {a, b}, kernels::binary(BinaryOp::mul, a, b),
                [a, b](const Node& self, const TensorList& g) {
                  return TensorList{
                      self.needs_grad(0) ? unbroadcast(mul(g[0], b), a.shape()) : Tensor(),
                      self.needs_grad(1) ? unbroadcast(mul(g[0], a), b.shape()) : Tensor()};
                });
}

Tensor div(const Tensor& a, const Tensor& b) {
  return record("div", {a, b}, kernels::binary(BinaryOp::div, a, b),
                [a, b](const Node& self, const TensorList& g) {
                  Tensor ga, gb;
                  if (self.needs_grad(0)) ga = unbroadcast(div(g[0], b), a.shape());
                  // d(a/b)/db = -a / b^2
                  if (self.needs_grad(1))
                    gb = unbroadcast(neg(div(mul(g[0], a), square(b))), b.shape());
                  return TensorList{ga, gb};
                });
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  return record("maximum", {a, b}, kernels::binary(BinaryOp::max, a, b),
                [a, b](const Node& self, const TensorList& g) {
                  // The gradient goes to a where a >= b, else to b (the mask is constant).
                  Tensor to_b = greater(b, a), to_a = 1.f - to_b;
                  return TensorList{
                      self.needs_grad(0) ? unbroadcast(mul(g[0], to_a), a.shape()) : Tensor(),
                      self.needs_grad(1) ? unbroadcast(mul(g[0], to_b), b.shape()) : Tensor()};
                });
}

Tensor greater(const Tensor& a, const Tensor& b) { return kernels::binary(BinaryOp::gt, a, b); }
Tensor equal(const Tensor& a, const Tensor& b) { return kernels::binary(BinaryOp::eq, a, b); }

// ---- with a scalar ------------------------------------------------------------------
Tensor add(const Tensor& a, float s) {
  return record("add_scalar", {a}, kernels::binary_scalar(BinaryOp::add, a, s),
                [](const Node&, const TensorList& g) { return TensorList{g[0]}; });
}

Tensor mul(const Tensor& a, float s) {
  return record("mul_scalar", {a}, kernels::binary_scalar(BinaryOp::mul, a, s),
                [s](const Node&, const TensorList& g) { return TensorList{mul(g[0], s)}; });
}

Tensor pow(const Tensor& a, float p) {
  return record("pow", {a}, kernels::binary_scalar(BinaryOp::pow, a, p),
                [a, p](const Node&, const TensorList& g) {
                  return TensorList{mul(g[0], mul(pow(a, p - 1.f), p))};
                });
}

// ---- unary ---------------------------------------------------------------------------
namespace {
// An op whose gradient is g * f'(x), with f'(x) written in terms of x.
template <typename Deriv>
Tensor unary_of_input(const char* name, UnaryOp op, const Tensor& x, Deriv deriv) {
  return record(name, {x}, kernels::unary(op, x), [x, deriv](const Node&, const TensorList& g) {
    return TensorList{mul(g[0], deriv(x))};
  });
}
// An op whose gradient is g * f'(x), with f'(x) written in terms of y = f(x).
template <typename Deriv>
Tensor unary_of_output(const char* name, UnaryOp op, const Tensor& x, Deriv deriv) {
  return record_with_output(name, {x}, kernels::unary(op, x),
                            [deriv](const Node&, const Tensor& y, const TensorList& g) {
                              return TensorList{mul(g[0], deriv(y))};
                            });
}
}  // namespace

Tensor neg(const Tensor& x) {
  return record("neg", {x}, kernels::unary(UnaryOp::neg, x),
                [](const Node&, const TensorList& g) { return TensorList{neg(g[0])}; });
}
Tensor exp(const Tensor& x) {
  return unary_of_output("exp", UnaryOp::exp, x, [](const Tensor& y) { return y; });
}
Tensor log(const Tensor& x) {
  return unary_of_input("log", UnaryOp::log, x, [](const Tensor& x) { return pow(x, -1.f); });
}
Tensor tanh(const Tensor& x) {
  return unary_of_output("tanh", UnaryOp::tanh, x, [](const Tensor& y) { return 1.f - square(y); });
}
Tensor sqrt(const Tensor& x) {  // d sqrt(x) = 1 / (2 sqrt(x))
  return unary_of_output("sqrt", UnaryOp::sqrt, x,
                         [](const Tensor& y) { return mul(pow(y, -1.f), 0.5f); });
}
Tensor rsqrt(const Tensor& x) {  // d x^-1/2 = -x^-3/2 / 2 = -y^3 / 2
  return unary_of_output("rsqrt", UnaryOp::rsqrt, x,
                         [](const Tensor& y) { return mul(pow(y, 3.f), -0.5f); });
}
Tensor sigmoid(const Tensor& x) {
  return unary_of_output("sigmoid", UnaryOp::sigmoid, x,
                         [](const Tensor& y) { return mul(y, 1.f - y); });
}
Tensor relu(const Tensor& x) {
  return unary_of_input("relu", UnaryOp::relu, x,
                        [](const Tensor& x) { return kernels::unary(UnaryOp::step, x); });
}
Tensor erf(const Tensor& x) {  // d erf(x) = 2/sqrt(pi) exp(-x^2)
  return unary_of_input("erf", UnaryOp::erf, x, [](const Tensor& x) {
    return mul(exp(neg(square(x))), float(2.0 / std::sqrt(std::numbers::pi)));
  });
}
Tensor square(const Tensor& x) {
  return unary_of_input("square", UnaryOp::square, x, [](const Tensor& x) { return mul(x, 2.f); });
}
Tensor abs(const Tensor& x) {  // sign(x), 0 at 0
  return unary_of_input("abs", UnaryOp::abs, x, [](const Tensor& x) {
    return kernels::unary(UnaryOp::step, x) - kernels::unary(UnaryOp::step, neg(x).detach());
  });
}

}  // namespace redco
