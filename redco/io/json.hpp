#pragma once
// io::Json: a small JSON value for state.json (step, epoch, seeds, schedule
// position, best metrics, the run's config). Parsing and printing go through
// rapidjson inside redco (its headers stay out of this one), so escaping and
// UTF-8 validation are rapidjson's well-tested code.
//
// Round trips are exact: integers are int64 (or uint64 above INT64_MAX, so a
// 64-bit seed survives), doubles print with enough digits to parse back to
// the same bits, NaN and +-Infinity print as NaN / Infinity / -Infinity (what
// Python's json module reads and writes) because a diverged run's metrics
// must still be saveable. 1 and 1.0 are different values: an integer stays an
// integer. Object keys are kept sorted, so dump() is deterministic; duplicate
// keys are a parse error rather than "last one wins".
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace redco::io {

class Json {
 public:
  enum class Kind : uint8_t { null, boolean, integer, real, string, array, object };
  using Array = std::vector<Json>;
  using Object = std::map<std::string, Json, std::less<>>;

  Json() = default;
  Json(std::nullptr_t) {}
  Json(bool b) : v_(b) {}
  template <std::integral T>
  requires(!std::same_as<T, bool>) Json(T i) {
    // uint64 holds only values int64 cannot, so each integer has one representation.
    if constexpr (std::is_signed_v<T>) {
      v_ = int64_t(i);
    } else if (uint64_t(i) <= uint64_t(INT64_MAX)) {
      v_ = int64_t(i);
    } else {
      v_ = uint64_t(i);
    }
  }
  Json(double d) : v_(d) {}
  Json(float f) : v_(double(f)) {}
  Json(const char* s) : v_(std::string(s)) {}
  Json(std::string s) : v_(std::move(s)) {}
  Json(std::string_view s) : v_(std::string(s)) {}
  Json(Array a) : v_(std::move(a)) {}
  Json(Object o) : v_(std::move(o)) {}
  static Json array() { return Json(Array{}); }
  static Json object() { return Json(Object{}); }

  // Throws redco::Error naming `source` (e.g. the file), the byte offset and
  // the problem: invalid JSON or UTF-8, duplicate keys, nesting deeper than
  // 256 levels. Integers beyond 64 bits parse as doubles.
  static Json parse(std::string_view text, std::string_view source = "JSON text");
  // Compact by default; pretty = two-space indentation. Throws on strings
  // that are not valid UTF-8.
  std::string dump(bool pretty = false) const;

  // v_'s alternatives are Kind's order, with int64 and uint64 both `integer`.
  Kind kind() const { return Kind(v_.index() <= 2 ? v_.index() : v_.index() - 1); }
  static const char* kind_name(Kind k);
  bool is_null() const { return kind() == Kind::null; }
  bool is_bool() const { return kind() == Kind::boolean; }
  bool is_int() const { return kind() == Kind::integer; }
  bool is_number() const { return is_int() || kind() == Kind::real; }
  bool is_string() const { return kind() == Kind::string; }
  bool is_array() const { return kind() == Kind::array; }
  bool is_object() const { return kind() == Kind::object; }

  // Typed access; the wrong kind (or an integer out of range) throws.
  bool as_bool() const;
  int64_t as_int() const;
  uint64_t as_uint() const;
  double as_double() const;  // any number
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  // Objects. operator[] turns a null into an object and inserts null members.
  bool contains(std::string_view key) const;
  const Json& at(std::string_view key) const;  // a missing key throws, naming it
  Json& operator[](std::string_view key);
  // Arrays. push_back turns a null into an array.
  const Json& at(size_t i) const;
  void push_back(Json v);
  size_t size() const;  // members of an object, elements of an array, else 0

  friend bool operator==(const Json& a, const Json& b) { return a.v_ == b.v_; }

 private:
  [[noreturn]] void wrong_kind(const char* wanted) const;
  std::variant<std::nullptr_t, bool, int64_t, uint64_t, double, std::string, Array, Object> v_;
};

}  // namespace redco::io
