// The image ops a diffusion UNet needs beyond convolution: group norm and
// nearest upsampling. Gradients against finite differences (first and second
// order), values and gradients against torch (committed goldens, written by
// tests/python/make_image_op_goldens.py), and the errors a bad shape gives.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "gradcheck.hpp"

using namespace redco;
using redco::test::check_gradients;
using redco::test::check_second_order;
using redco::test::randn;
namespace fs = std::filesystem;

namespace {
// The closed-form inputs of make_image_op_goldens.py.
Tensor closed_form_input(const Shape& s) {
  std::vector<float> v(size_t(s.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = float(std::sin(0.7 * double(i)) * (1 + 0.1 * double(i % 5)) + 0.3);
  return Tensor::from<float>(v, s);
}
Tensor probe(const Shape& s) {
  std::vector<float> v(size_t(s.numel()));
  for (size_t j = 0; j < v.size(); ++j) v[j] = float(std::cos(0.3 * double(j)));
  return Tensor::from<float>(v, s);
}

std::map<std::string, std::vector<float>> load_goldens() {
  std::error_code ec;
  fs::path file;
  for (fs::path start : {fs::path(__FILE__).parent_path().parent_path(), fs::current_path()})
    for (fs::path p = fs::absolute(start, ec); file.empty() && !p.empty(); p = p.parent_path()) {
      if (fs::exists(p / "tests/goldens/image_ops.txt", ec))
        file = p / "tests/goldens/image_ops.txt";
      if (p == p.parent_path()) break;
    }
  REQUIRE(!file.empty());
  std::ifstream in(file);
  std::map<std::string, std::vector<float>> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string name;
    size_t n = 0;
    ls >> name >> n;
    std::vector<float>& v = out[name];
    v.resize(n);
    for (float& x : v) ls >> x;
  }
  return out;
}

void check_matches(const Tensor& t, const std::vector<float>& want, float tol, const char* what) {
  INFO(what);
  REQUIRE(size_t(t.numel()) == want.size());
  const auto got = t.to_vector();
  float worst = 0.f;
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  CHECK(worst < tol);
}
}  // namespace

TEST_CASE("group norm and nearest upsampling: first and second order", "[grad]") {
  // Channels 6 in 3 groups over a 3x4 image; a mean far from 0 tests the
  // corrected variance.
  TensorList in{randn({2, 6, 3, 4}, 41) + 3.f, randn({6}, 42) + 1.f, randn({6}, 43)};
  auto gn = [](const TensorList& x) { return group_norm(x[0], 3, x[1], x[2]); };
  check_gradients(gn, in, {0, 1, 2});
  check_second_order(gn, in, 0, {0, 1});
  check_second_order(gn, in, 1, {0, 1});
  auto gn_no_beta = [](const TensorList& x) { return group_norm(x[0], 2, x[1]); };
  check_gradients(gn_no_beta, {in[0], in[1]}, {0, 1});
  auto gn_3d = [](const TensorList& x) { return group_norm(x[0], 2, x[1], x[2]); };  // [N, C, L]
  check_gradients(gn_3d, {randn({3, 4, 5}, 44), randn({4}, 45), randn({4}, 46)}, {0, 1, 2});

  TensorList img{randn({2, 3, 3, 4}, 47)};
  auto up = [](const TensorList& x) { return upsample_nearest2d(x[0], 2); };
  check_gradients(up, img, {0});
  check_gradients([](const TensorList& x) { return upsample_nearest2d(x[0], 3); }, img, {0});
  check_second_order([](const TensorList& x) { return square(upsample_nearest2d(x[0], 2)); }, img,
                     0, {0});
}

TEST_CASE("group norm and nearest upsampling equal torch's, values and gradients", "[grad]") {
  const auto golden = load_goldens();
  const Shape shape{2, 6, 3, 4};
  std::vector<float> g(6), b(6);
  for (int c = 0; c < 6; ++c)
    g[size_t(c)] = 1.f + 0.1f * float(c), b[size_t(c)] = 0.05f * float(c) - 0.1f;
  Tensor x = closed_form_input(shape).set_requires_grad(true);
  Tensor gamma = Tensor::from<float>(g, {6}).set_requires_grad(true);
  Tensor beta = Tensor::from<float>(b, {6}).set_requires_grad(true);
  Tensor y = group_norm(x, 3, gamma, beta);
  TensorList d = grad({sum(y * probe(y.shape()))}, {x, gamma, beta});
  check_matches(y, golden.at("group_norm.y"), 1e-5f, "group_norm.y");
  check_matches(d[0], golden.at("group_norm.dx"), 2e-5f, "group_norm.dx");
  check_matches(d[1], golden.at("group_norm.dgamma"), 2e-5f, "group_norm.dgamma");
  check_matches(d[2], golden.at("group_norm.dbeta"), 2e-5f, "group_norm.dbeta");

  Tensor x2 = closed_form_input(shape).set_requires_grad(true);
  Tensor u = upsample_nearest2d(x2, 2);
  CHECK(u.shape() == Shape{2, 6, 6, 8});
  Tensor du = grad({sum(u * probe(u.shape()))}, {x2})[0];
  check_matches(u, golden.at("upsample.y"), 1e-6f, "upsample.y");
  check_matches(du, golden.at("upsample.dx"), 1e-5f, "upsample.dx");
}

TEST_CASE("group norm and upsampling name a bad shape", "[grad]") {
  CHECK_THROWS_WITH(group_norm(randn({2, 6, 4}, 1), 4, randn({6}, 2)),
                    Catch::Contains("divisible by the 4 groups"));
  CHECK_THROWS_WITH(group_norm(randn({2, 6, 4}, 1), 3, randn({5}, 2)),
                    Catch::Contains("gamma [5] must be [6]"));
  CHECK_THROWS_WITH(upsample_nearest2d(randn({2, 6, 4}, 1), 2),
                    Catch::Contains("expected x [N, C, H, W]"));
}
