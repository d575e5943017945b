// io::Json (json.hpp) on top of rapidjson, which only this file includes.
#include "redco/io/json.hpp"

#include <rapidjson/document.h>
#include <rapidjson/encodedstream.h>
#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <string>

#include "redco/core/error.hpp"

// rapidjson's member iterators predate C++20's reversed comparison operators;
// clang warns on every loop over them although the call is unambiguous.
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wambiguous-reversed-operator"
#endif

namespace redco::io {

namespace {

constexpr int kMaxJsonDepth = 256;

template <typename Writer>
void write_json(Writer& w, const Json& j) {
  switch (j.kind()) {
    case Json::Kind::null:
      w.Null();
      return;
    case Json::Kind::boolean:
      w.Bool(j.as_bool());
      return;
    case Json::Kind::integer:
      if (j.as_double() < 0) {
        w.Int64(j.as_int());
      } else {
        w.Uint64(j.as_uint());
      }
      return;
    case Json::Kind::real:
      w.Double(j.as_double());
      return;
    case Json::Kind::string: {
      const std::string& s = j.as_string();
      if (!w.String(s.data(), rapidjson::SizeType(s.size())))
        fail("JSON string '{}' is not valid UTF-8", s);
      return;
    }
    case Json::Kind::array:
      w.StartArray();
      for (const Json& x : j.as_array()) write_json(w, x);
      w.EndArray();
      return;
    case Json::Kind::object:
      w.StartObject();
      for (const auto& [k, v] : j.as_object()) {
        if (!w.Key(k.data(), rapidjson::SizeType(k.size())))
          fail("JSON key '{}' is not valid UTF-8", k);
        write_json(w, v);
      }
      w.EndObject();
      return;
  }
}

// NaN and infinities are written (as NaN, Infinity, -Infinity); invalid UTF-8 is refused.
using CompactWriter =
    rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>,
                      rapidjson::CrtAllocator,
                      rapidjson::kWriteValidateEncodingFlag | rapidjson::kWriteNanAndInfFlag>;

std::string compact(const Json& j) {
  rapidjson::StringBuffer buf;
  CompactWriter w(buf);
  write_json(w, j);
  return std::string(buf.GetString(), buf.GetSize());
}

// rapidjson 1.1's PrettyWriter drops the writer flags (so it would refuse
// NaN), hence this small indenting printer over compact leaves.
void dump_pretty(const Json& j, int depth, std::string& out) {
  if (j.size() == 0) {
    out += compact(j);
    return;
  }
  const std::string inner(2 * (depth + 1), ' ');
  bool first = true;
  auto next = [&] {
    out += first ? "\n" : ",\n";
    out += inner;
    first = false;
  };
  if (j.is_array()) {
    out += '[';
    for (const Json& x : j.as_array()) {
      next();
      dump_pretty(x, depth + 1, out);
    }
  } else {
    out += '{';
    for (const auto& [k, v] : j.as_object()) {
      next();
      out += compact(Json(k)) + ": ";
      dump_pretty(v, depth + 1, out);
    }
  }
  out += '\n' + std::string(2 * depth, ' ') + (j.is_array() ? ']' : '}');
}

}  // namespace

namespace {

// A JSON number from its text: an integer when it is one and fits 64 bits,
// else the correctly rounded double (std::from_chars). rapidjson 1.1's own
// full-precision conversion has undefined behaviour on inputs such as 0e92
// (clz of 0, then a shift by a garbage amount; found by
// tests/fuzz/fuzz_state_json.cpp), so numbers reach us as text.
Json json_number(std::string_view t, std::string_view source) {
  const char *b = t.data(), *e = b + t.size();
  if (t.find_first_of(".eEnNIi") == std::string_view::npos) {
    int64_t i = 0;
    if (auto [p, ec] = std::from_chars(b, e, i); ec == std::errc() && p == e) return i;
    uint64_t u = 0;
    if (auto [p, ec] = std::from_chars(b, e, u); ec == std::errc() && p == e) return u;
  }
  double d = 0;
  const auto [p, ec] = std::from_chars(b, e, d);
  if (ec == std::errc::result_out_of_range && p == e) {
    // Too small for a double rounds to zero; too large is an error, as in rapidjson.
    const size_t x = t.find_first_of("eE");
    if (x != std::string_view::npos && x + 1 < t.size() && t[x + 1] == '-')
      return t.front() == '-' ? -0.0 : 0.0;
    fail("{}: the JSON number {} is too large for a double", source, t);
  }
  if (ec != std::errc() || p != e) fail("{}: '{}' is not a JSON number", source, t);
  return d;
}

// Whether a decoded string is valid UTF-8. The parser checks the raw bytes,
// but a \u escape of a lone UTF-16 surrogate (\udc00) decodes to bytes that
// are not a character; such a document could not be written back (found by
// tests/fuzz/fuzz_state_json.cpp).
bool valid_utf8(const char* s, size_t n) {
  rapidjson::MemoryStream in(s, n);
  rapidjson::GenericStringBuffer<rapidjson::UTF8<>> copy;  // Validate copies what it reads
  while (in.Tell() < n)
    if (!rapidjson::UTF8<>::Validate(in, copy)) return false;
  return true;
}

// Builds a Json from rapidjson's SAX events (numbers as text, see json_number).
struct JsonBuilder {
  std::string_view source;
  std::vector<Json> open;         // containers not yet closed, innermost last
  std::vector<std::string> keys;  // the pending key of each open container
  Json root;

  bool add(Json v) {
    if (open.empty()) return root = std::move(v), true;
    Json& top = open.back();
    if (top.is_array()) return top.push_back(std::move(v)), true;
    Json::Object& o = top.as_object();
    if (o.count(keys.back())) fail("{}: JSON object has the key '{}' twice", source, keys.back());
    o.emplace(std::move(keys.back()), std::move(v));
    return true;
  }
  bool start(Json container) {
    if (int(open.size()) >= kMaxJsonDepth)
      fail("{}: JSON nested deeper than {} levels", source, kMaxJsonDepth);
    open.push_back(std::move(container));
    keys.emplace_back();
    return true;
  }
  bool end() {
    Json v = std::move(open.back());
    open.pop_back();
    keys.pop_back();
    return add(std::move(v));
  }
  bool Null() { return add(nullptr); }
  bool Bool(bool b) { return add(b); }
  bool Int(int i) { return add(i); }
  bool Uint(unsigned u) { return add(u); }
  bool Int64(int64_t i) { return add(i); }
  bool Uint64(uint64_t u) { return add(u); }
  bool Double(double d) { return add(d); }
  bool RawNumber(const char* s, rapidjson::SizeType n, bool) {
    return add(json_number({s, n}, source));
  }
  void check_text(const char* s, rapidjson::SizeType n) const {
    if (!valid_utf8(s, n))
      fail(
          "{}: the JSON string '{}' holds a \\u escape that is no character (a lone UTF-16 "
          "surrogate)",
          source, std::string_view(s, n));
  }
  bool String(const char* s, rapidjson::SizeType n, bool) {
    check_text(s, n);
    return add(std::string(s, n));
  }
  bool StartObject() { return start(Json::object()); }
  bool Key(const char* s, rapidjson::SizeType n, bool) {
    check_text(s, n);
    return keys.back().assign(s, n), true;
  }
  bool EndObject(rapidjson::SizeType) { return end(); }
  bool StartArray() { return start(Json::array()); }
  bool EndArray(rapidjson::SizeType) { return end(); }
};

}  // namespace

Json Json::parse(std::string_view text, std::string_view source) {
  constexpr unsigned kFlags = rapidjson::kParseValidateEncodingFlag |
                              rapidjson::kParseIterativeFlag | rapidjson::kParseNanAndInfFlag |
                              rapidjson::kParseNumbersAsStringsFlag;
  rapidjson::Reader reader;
  rapidjson::MemoryStream bytes(text.data(), text.size());
  rapidjson::EncodedInputStream<rapidjson::UTF8<>, rapidjson::MemoryStream> in(bytes);
  JsonBuilder builder{source, {}, {}, {}};
  const rapidjson::ParseResult ok = reader.Parse<kFlags>(in, builder);
  if (!ok)
    fail("{}: invalid JSON at byte {}: {}", source, ok.Offset(),
         rapidjson::GetParseError_En(ok.Code()));
  return std::move(builder.root);
}

std::string Json::dump(bool pretty) const {
  if (!pretty) return compact(*this);
  std::string out;
  dump_pretty(*this, 0, out);
  return out;
}

const char* Json::kind_name(Kind k) {
  constexpr const char* kNames[] = {"null",   "bool",  "integer", "number",
                                    "string", "array", "object"};
  return kNames[int(k)];
}

void Json::wrong_kind(const char* wanted) const {
  fail("JSON: expected {}, got {}", wanted, kind_name(kind()));
}

bool Json::as_bool() const {
  if (!is_bool()) wrong_kind("a bool");
  return std::get<bool>(v_);
}

int64_t Json::as_int() const {
  if (const auto* i = std::get_if<int64_t>(&v_)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&v_)) fail("JSON: {} does not fit an int64", *u);
  wrong_kind("an integer");
}

uint64_t Json::as_uint() const {
  if (const auto* u = std::get_if<uint64_t>(&v_)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v_)) {
    if (*i < 0) fail("JSON: expected a non-negative integer, got {}", *i);
    return uint64_t(*i);
  }
  wrong_kind("an integer");
}

double Json::as_double() const {
  if (const auto* d = std::get_if<double>(&v_)) return *d;
  if (const auto* i = std::get_if<int64_t>(&v_)) return double(*i);
  if (const auto* u = std::get_if<uint64_t>(&v_)) return double(*u);
  wrong_kind("a number");
}

const std::string& Json::as_string() const {
  if (!is_string()) wrong_kind("a string");
  return std::get<std::string>(v_);
}

const Json::Array& Json::as_array() const {
  if (!is_array()) wrong_kind("an array");
  return std::get<Array>(v_);
}

Json::Array& Json::as_array() {
  if (!is_array()) wrong_kind("an array");
  return std::get<Array>(v_);
}

const Json::Object& Json::as_object() const {
  if (!is_object()) wrong_kind("an object");
  return std::get<Object>(v_);
}

Json::Object& Json::as_object() {
  if (!is_object()) wrong_kind("an object");
  return std::get<Object>(v_);
}

bool Json::contains(std::string_view key) const {
  return is_object() && as_object().find(key) != as_object().end();
}

const Json& Json::at(std::string_view key) const {
  const auto it = as_object().find(key);
  if (it == as_object().end()) fail("JSON: the object has no key '{}'", key);
  return it->second;
}

Json& Json::operator[](std::string_view key) {
  if (is_null()) v_ = Object{};
  Object& o = as_object();
  auto it = o.find(key);
  if (it == o.end()) it = o.emplace(std::string(key), Json()).first;
  return it->second;
}

const Json& Json::at(size_t i) const {
  const Array& a = as_array();
  if (i >= a.size()) fail("JSON: index {} is out of range for an array of {}", i, a.size());
  return a[i];
}

void Json::push_back(Json v) {
  if (is_null()) v_ = Array{};
  as_array().push_back(std::move(v));
}

size_t Json::size() const {
  if (is_array()) return as_array().size();
  if (is_object()) return as_object().size();
  return 0;
}

}  // namespace redco::io
