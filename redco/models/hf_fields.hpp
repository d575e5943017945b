#pragma once
// A family's plain config.json keys, each named once beside the config member
// it fills: read_fields sets the members from a config.json (hf::Config's
// rules: a key with a fallback may be absent or null, one without is
// required), write_fields writes them back. Keys with a rule of their own (a
// value computed from others, a refusal, a quirk of the reference's format)
// stay written out in the family's two functions, after these.
#include <optional>
#include <span>
#include <type_traits>
#include <variant>

#include "redco/io/json.hpp"
#include "redco/models/hf_checkpoint.hpp"
#include "redco/models/hf_util.hpp"

namespace redco::models::hf {

// One key: a size (int64_t), a number (float), a flag (bool) or an
// activation (nn::Act, by transformers' ACT2FN name).
template <typename C>
struct Field {
  const char* key;
  std::variant<int64_t C::*, float C::*, bool C::*, nn::Act C::*> member;
  std::optional<double> fallback = std::nullopt;  // absent or null: this value; none: required
  const char* act_fallback = nullptr;             // an activation's, by name
};

template <typename C>
void read_fields(const Config& f, C& c, std::span<const Field<C>> fields) {
  for (const Field<C>& field : fields)
    std::visit(
        [&](auto member) {
          auto& v = c.*member;
          using T = std::remove_reference_t<decltype(v)>;
          const auto& fb = field.fallback;
          if constexpr (std::is_same_v<T, int64_t>)
            v = fb ? f.size(field.key, int64_t(*fb)) : f.size(field.key);
          else if constexpr (std::is_same_v<T, float>)
            v = float(fb ? f.number(field.key, *fb) : f.number(field.key));
          else if constexpr (std::is_same_v<T, bool>)
            v = f.boolean(field.key, fb.value_or(0.0) != 0.0);
          else
            v = activation(f, field.key, field.act_fallback);
        },
        field.member);
}

template <typename C>
void write_fields(const C& c, io::Json& j, std::span<const Field<C>> fields) {
  for (const Field<C>& field : fields)
    std::visit(
        [&](auto member) {
          const auto& v = c.*member;
          using T = std::remove_cvref_t<decltype(v)>;
          if constexpr (std::is_same_v<T, float>)
            j[field.key] = double(v);
          else if constexpr (std::is_same_v<T, nn::Act>)
            j[field.key] = activation_name(v);
          else
            j[field.key] = v;
        },
        field.member);
}

}  // namespace redco::models::hf
