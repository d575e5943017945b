#pragma once
// Moving a user's batch onto the run's device. A collate function builds CPU
// tensors (it runs on the host, from host data); the Trainer and Predictor
// move each batch to the Deployer's device at the step boundary, so a program
// never mentions devices. What moves: a Tensor; a vector, array, optional or
// pair of movable things; a type with `T to(Device) const`; an aggregate
// struct of up to 8 fields (no base classes), field by field. Anything else (ints, strings,
// host-side vectors of numbers) stays as it is.
#include <array>
#include <concepts>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "redco/core/tensor.hpp"

namespace redco::train {

namespace detail {
// Converts to any field type: counts an aggregate's fields by brace-initialising it.
struct AnyField {
  template <typename T>
  operator T() const;  // never defined: used in unevaluated contexts only
};
template <typename T, std::size_t... I>
constexpr bool brace_n(std::index_sequence<I...>) {
  return requires { T{(void(I), AnyField{})...}; };
}
// An aggregate's field count (9: more than 8). AnyField converts to any
// member type, so no brace elision inflates the count.
template <typename T, std::size_t N = 9>
constexpr std::size_t field_count() {
  if constexpr (N == 0) {
    return 0;
  } else if constexpr (brace_n<T>(std::make_index_sequence<N>{})) {
    return N;
  } else {
    return field_count<T, N - 1>();
  }
}
}  // namespace detail

template <typename T>
void move_to_device(T& value, Device d);

namespace detail {
// Fields of structs with more than 8 stay where they are (an op then names
// the device mix); such a batch type can give itself a to(Device) member.
template <typename T>
void move_fields(T& v, Device d) {
  constexpr std::size_t n = field_count<T>();
  [[maybe_unused]] auto each = [d](auto&... f) { (move_to_device(f, d), ...); };
  if constexpr (n == 1) {
    auto& [a] = v;
    each(a);
  } else if constexpr (n == 2) {
    auto& [a, b] = v;
    each(a, b);
  } else if constexpr (n == 3) {
    auto& [a, b, c] = v;
    each(a, b, c);
  } else if constexpr (n == 4) {
    auto& [a, b, c, e] = v;
    each(a, b, c, e);
  } else if constexpr (n == 5) {
    auto& [a, b, c, e, f] = v;
    each(a, b, c, e, f);
  } else if constexpr (n == 6) {
    auto& [a, b, c, e, f, g] = v;
    each(a, b, c, e, f, g);
  } else if constexpr (n == 7) {
    auto& [a, b, c, e, f, g, h] = v;
    each(a, b, c, e, f, g, h);
  } else if constexpr (n == 8) {
    auto& [a, b, c, e, f, g, h, i] = v;
    each(a, b, c, e, f, g, h, i);
  }
}
template <typename T>
struct is_vector : std::false_type {};
template <typename T, typename A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <typename T>
struct is_optional : std::false_type {};
template <typename T>
struct is_optional<std::optional<T>> : std::true_type {};
template <typename T>
struct is_pair : std::false_type {};
template <typename A, typename B>
struct is_pair<std::pair<A, B>> : std::true_type {};
template <typename T>
struct is_array : std::false_type {};
template <typename T, std::size_t N>
struct is_array<std::array<T, N>> : std::true_type {};
}  // namespace detail

// Moves, in place, every tensor `value` holds to `d` (see above).
template <typename T>
void move_to_device(T& value, Device d) {
  if constexpr (std::is_const_v<T>) {
    return;  // a const member cannot be replaced
  } else if constexpr (std::is_same_v<T, Tensor>) {
    if (value.defined()) value = value.to(d);
  } else if constexpr (requires(const T& t, Device to) {
                         { t.to(to) } -> std::convertible_to<T>;
                       }) {
    value = value.to(d);
  } else if constexpr (detail::is_vector<T>::value || detail::is_array<T>::value) {
    if constexpr (!std::is_arithmetic_v<typename T::value_type>)
      for (auto& x : value) move_to_device(x, d);
  } else if constexpr (detail::is_optional<T>::value) {
    if (value) move_to_device(*value, d);
  } else if constexpr (detail::is_pair<T>::value) {
    move_to_device(value.first, d);
    move_to_device(value.second, d);
  } else if constexpr (std::is_aggregate_v<T> && !std::is_array_v<T>) {
    detail::move_fields(value, d);
  }
}

// `batch` with its tensors on `d`; a CPU run returns it untouched.
template <typename T>
T on_device(T batch, Device d) {
  if (!d.is_cpu()) move_to_device(batch, d);
  return batch;
}

}  // namespace redco::train
