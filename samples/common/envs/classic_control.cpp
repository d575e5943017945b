// Classic-control dynamics. Every expression keeps the operand order and
// grouping of Gymnasium 1.0's Python (left-to-right evaluation of NumPy
// float64 scalars), and this file is built with -ffp-contract=off, so each
// step rounds exactly as Gymnasium's does up to the last bit of sin/cos.
#include "envs/classic_control.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "redco/core/philox.hpp"

namespace redco::rl {
namespace {

constexpr double pi = std::numbers::pi;

// NumPy's float64 remainder: the sign follows the divisor, as Python's %.
double py_mod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0) {
    if ((b < 0) != (m < 0)) m += b;
  } else {
    m = std::copysign(0.0, b);
  }
  return m;
}

}  // namespace

double Uniform::operator()(double lo, double hi) {
  // Two 32-bit lanes -> 53 bits, the same construction as NumPy's random().
  const uint64_t idx = episode * 16 + uint64_t(2 * next++);
  const uint32_t a = philox_bits(seed, stream, idx) >> 5;
  const uint32_t b = philox_bits(seed, stream, idx + 1) >> 6;
  const double unit = (double(a) * 67108864.0 + double(b)) * 0x1p-53;
  return lo + (hi - lo) * unit;
}

// ---- CartPole ---------------------------------------------------------------------------------

namespace cartpole {
constexpr double gravity = 9.8, masscart = 1.0, masspole = 0.1;
constexpr double total_mass = masspole + masscart;
constexpr double length = 0.5;  // half the pole's length
constexpr double polemass_length = masspole * length;
constexpr double force_mag = 10.0, tau = 0.02;
constexpr double theta_threshold = 12 * 2 * pi / 360, x_threshold = 2.4;
}  // namespace cartpole

void CartPole::reset(double* s, Uniform& u) {
  for (int i = 0; i < 4; ++i) s[i] = u(-0.05, 0.05);
}

Transition CartPole::step(double* s, int64_t action) {
  using namespace cartpole;
  double x = s[0], x_dot = s[1], theta = s[2], theta_dot = s[3];
  const double force = action == 1 ? force_mag : -force_mag;
  const double costheta = std::cos(theta), sintheta = std::sin(theta);
  const double temp = (force + polemass_length * (theta_dot * theta_dot) * sintheta) / total_mass;
  const double thetaacc = (gravity * sintheta - costheta * temp) /
                          (length * (4.0 / 3.0 - masspole * (costheta * costheta) / total_mass));
  const double xacc = temp - polemass_length * thetaacc * costheta / total_mass;
  x = x + tau * x_dot;
  x_dot = x_dot + tau * xacc;
  theta = theta + tau * theta_dot;
  theta_dot = theta_dot + tau * thetaacc;
  s[0] = x, s[1] = x_dot, s[2] = theta, s[3] = theta_dot;
  const bool terminated =
      x < -x_threshold || x > x_threshold || theta < -theta_threshold || theta > theta_threshold;
  return {1.0, terminated};
}

void CartPole::observe(const double* s, float* obs) {
  for (int i = 0; i < 4; ++i) obs[i] = float(s[i]);
}

// ---- Acrobot ----------------------------------------------------------------------------------

namespace acrobot {
constexpr double dt = 0.2;
constexpr double l1 = 1.0, m1 = 1.0, m2 = 1.0, lc1 = 0.5, lc2 = 0.5, I1 = 1.0, I2 = 1.0;
constexpr double g = 9.8;
constexpr double max_vel_1 = 4 * pi, max_vel_2 = 9 * pi;
constexpr double torques[3] = {-1.0, 0.0, 1.0};

// d/dt of (theta1, theta2, dtheta1, dtheta2) under torque a: the "book"
// equations (Sutton & Barto), grouped as Gymnasium's _dsdt.
void dsdt(const double* s, double a, double* d) {
  const double theta1 = s[0], theta2 = s[1], dtheta1 = s[2], dtheta2 = s[3];
  const double c2 = std::cos(theta2), s2 = std::sin(theta2);
  const double d1 = m1 * (lc1 * lc1) + m2 * ((l1 * l1) + (lc2 * lc2) + 2 * l1 * lc2 * c2) + I1 + I2;
  const double d2 = m2 * ((lc2 * lc2) + l1 * lc2 * c2) + I2;
  const double phi2 = m2 * lc2 * g * std::cos(theta1 + theta2 - pi / 2.0);
  const double phi1 = -m2 * l1 * lc2 * (dtheta2 * dtheta2) * s2 -
                      2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * s2 +
                      (m1 * lc1 + m2 * l1) * g * std::cos(theta1 - pi / 2) + phi2;
  const double ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * (dtheta1 * dtheta1) * s2 - phi2) /
                          (m2 * (lc2 * lc2) + I2 - (d2 * d2) / d1);
  const double ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
  d[0] = dtheta1, d[1] = dtheta2, d[2] = ddtheta1, d[3] = ddtheta2;
}

// Gymnasium's wrap(): shifts by whole turns into [m, M].
double wrap(double x, double m, double M) {
  const double diff = M - m;
  while (x > M) x = x - diff;
  while (x < m) x = x + diff;
  return x;
}

// Python's min(max(x, m), M).
double bound(double x, double m, double M) {
  const double lo = m > x ? m : x;
  return M < lo ? M : lo;
}
}  // namespace acrobot

void Acrobot::reset(double* s, Uniform& u) {
  for (int i = 0; i < 4; ++i) s[i] = double(float(u(-0.1, 0.1)));
}

Transition Acrobot::step(double* s, int64_t action) {
  using namespace acrobot;
  const double a = torques[action];
  // One RK4 step over [0, dt]; the torque rides along as a constant fifth
  // component in Gymnasium, which leaves the four others unchanged.
  constexpr double h = dt - 0.0, h2 = h / 2.0;
  double k1[4], k2[4], k3[4], k4[4], y[4];
  dsdt(s, a, k1);
  for (int i = 0; i < 4; ++i) y[i] = s[i] + h2 * k1[i];
  dsdt(y, a, k2);
  for (int i = 0; i < 4; ++i) y[i] = s[i] + h2 * k2[i];
  dsdt(y, a, k3);
  for (int i = 0; i < 4; ++i) y[i] = s[i] + h * k3[i];
  dsdt(y, a, k4);
  for (int i = 0; i < 4; ++i) y[i] = s[i] + h / 6.0 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);
  s[0] = wrap(y[0], -pi, pi);
  s[1] = wrap(y[1], -pi, pi);
  s[2] = bound(y[2], -max_vel_1, max_vel_1);
  s[3] = bound(y[3], -max_vel_2, max_vel_2);
  const bool terminated = -std::cos(s[0]) - std::cos(s[1] + s[0]) > 1.0;
  return {terminated ? 0.0 : -1.0, terminated};
}

void Acrobot::observe(const double* s, float* obs) {
  obs[0] = float(std::cos(s[0]));
  obs[1] = float(std::sin(s[0]));
  obs[2] = float(std::cos(s[1]));
  obs[3] = float(std::sin(s[1]));
  obs[4] = float(s[2]);
  obs[5] = float(s[3]);
}

// ---- Pendulum ---------------------------------------------------------------------------------

namespace pendulum {
constexpr double max_speed = 8, dt = 0.05, g = 10.0, m = 1.0, l = 1.0;
}  // namespace pendulum

void Pendulum::reset(double* s, Uniform& u) {
  s[0] = u(-pi, pi);
  s[1] = u(-1.0, 1.0);
}

Transition Pendulum::step(double* s, const float* action) {
  using namespace pendulum;
  const double th = s[0], thdot = s[1];
  const double u = double(action[0]);  // NumPy widens the float32 torque here too
  const double angle = py_mod(th + pi, 2 * pi) - pi;
  const double costs = angle * angle + 0.1 * (thdot * thdot) + 0.001 * (u * u);
  double newthdot = thdot + (3 * g / (2 * l) * std::sin(th) + 3.0 / (m * (l * l)) * u) * dt;
  newthdot = std::clamp(newthdot, -max_speed, max_speed);
  const double newth = th + newthdot * dt;
  s[0] = newth, s[1] = newthdot;
  return {-costs, false};
}

void Pendulum::observe(const double* s, float* obs) {
  obs[0] = float(std::cos(s[0]));
  obs[1] = float(std::sin(s[0]));
  obs[2] = float(s[1]);
}

}  // namespace redco::rl
