#include "redco/models/hf_util.hpp"

#include <fmt/format.h>

namespace redco::models::hf {

TensorSource same(std::string param, std::string hf, Shape shape) {
  return {std::move(param), std::move(hf), std::move(shape), false, {}};
}

nn::Act activation(const Config& config, std::string_view key, std::string_view fallback) {
  const std::string name = config.string(key, std::string(fallback));
  // gelu_new, gelu_fast and gelu_pytorch_tanh are one formula (the tanh approximation).
  if (name == "gelu_new" || name == "gelu_fast" || name == "gelu_pytorch_tanh")
    return nn::Act::gelu;
  if (name == "gelu") return nn::Act::gelu_erf;
  if (name == "relu") return nn::Act::relu;
  if (name == "silu" || name == "swish") return nn::Act::silu;
  if (name == "tanh") return nn::Act::tanh;
  config.fail(key, fmt::format("= \"{}\" is not an activation redco implements (gelu_new, "
                               "gelu_fast, gelu_pytorch_tanh, gelu, relu, silu, swish, tanh)",
                               name));
}

std::string activation_name(nn::Act a) {
  switch (a) {
    case nn::Act::gelu:
      return "gelu_new";
    case nn::Act::gelu_erf:
      return "gelu";
    case nn::Act::relu:
      return "relu";
    case nn::Act::silu:
      return "silu";
    case nn::Act::tanh:
      return "tanh";
  }
  return "gelu_new";
}

}  // namespace redco::models::hf
