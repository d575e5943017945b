#pragma once
// Small image classifiers for 28x28 single-channel images (MNIST,
// Fashion-MNIST), input [N, C, H, W] f32, output logits [N, classes].
//
// mlp_classifier: flatten | fc_1 | relu | dropout | fc_2. One hidden layer
// keeps the tensor-parallel plan a single column/row pair (fc_1 splits its
// outputs, fc_2 its inputs, one all-reduce), so the logits come out whole.
// small_cnn: conv_1 | relu | pool | conv_2 | relu | pool | flatten | fc.
// The convolutions are replicated (image models this small are
// data-parallel); under tensor parallelism the last fc splits the classes when
// they divide, and the logits come out class-split (cross_entropy reads them
// as they are; nn::whole gathers them).
#include "redco/nn/model.hpp"

namespace redco::models {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct MlpClassifierConfig {
  int64_t inputs = 28 * 28;  // C * H * W
  int64_t hidden = 256;
  int64_t classes = 10;
  float dropout = 0.f;
};

inline auto mlp_classifier(const MlpClassifierConfig& c) {
  return nn::flatten() | nn::linear(c.inputs, c.hidden) | nn::relu() | nn::dropout(c.dropout) |
         nn::linear(c.hidden, c.classes);
}

using MlpClassifier = decltype(mlp_classifier(MlpClassifierConfig{}));

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct SmallCnnConfig {
  int64_t channels = 1;  // input channels
  int64_t size = 28;     // input height = width; must divide by 4 (two 2x2 poolings)
  int64_t classes = 10;
  int64_t conv1 = 16;  // channels after the first convolution
  int64_t conv2 = 32;
};

inline auto small_cnn(const SmallCnnConfig& c) {
  REDCO_CHECK(c.size % 4 == 0, "small_cnn: image size {} must be a multiple of 4", c.size);
  const int64_t side = c.size / 4;
  return nn::conv2d(c.channels, c.conv1) | nn::relu() | nn::max_pool() |
         nn::conv2d(c.conv1, c.conv2) | nn::relu() | nn::max_pool() | nn::flatten() |
         nn::linear(c.conv2 * side * side, c.classes);
}

using SmallCnn = decltype(small_cnn(SmallCnnConfig{}));

}  // namespace redco::models
