// Python's semantics for the chat template's values: truth, equality, str()
// and repr(), json.dumps (transformers' tojson), lengths and iteration over
// code points, str.strip. What a template prints must be byte for byte what
// Python prints, so each follows CPython's rules rather than C++'s.
#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "redco/data/chat_template_ast.hpp"
#include "redco/data/utf8.hpp"

namespace redco::data::chat_detail {

Value Value::make_list(List items) {
  Value v = make(Kind::list);
  v.list = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::make_dict(Kind kind) {
  Value v = make(kind);
  v.dict = std::make_shared<Dict>();
  return v;
}

Value Value::from_json(const io::Json& j) {
  using K = io::Json::Kind;
  switch (j.kind()) {
    case K::null:
      return none();
    case K::boolean:
      return boolean(j.as_bool());
    case K::integer:
      try {
        return integer(j.as_int());
      } catch (const Error&) {
        return real(double(j.as_uint()));  // above INT64_MAX: Python's int, approximated
      }
    case K::real:
      return real(j.as_double());
    case K::string:
      return string(j.as_string());
    case K::array: {
      List items;
      for (const io::Json& x : j.as_array()) items.push_back(from_json(x));
      return make_list(std::move(items));
    }
    case K::object: {
      Value d = make_dict();
      for (const auto& [k, x] : j.as_object()) d.dict->items.emplace_back(k, from_json(x));
      return d;
    }
  }
  return none();
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, x] : items)
    if (k == key) {
      x = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value Args::take(size_t index, std::string_view name, Value fallback) {
  for (auto it = kw.begin(); it != kw.end(); ++it)
    if (it->first == name) {
      Value v = std::move(it->second);
      kw.erase(it);
      return v;
    }
  if (index < pos.size()) {
    taken_pos = std::max(taken_pos, index + 1);
    return pos[index];
  }
  return fallback;
}

void Args::check_consumed(std::string_view what) const {
  if (!kw.empty()) py_error(fmt::format("{}: unexpected keyword argument '{}'", what, kw[0].first));
  if (pos.size() > taken_pos) py_error(fmt::format("{}: too many arguments", what));
}

bool truthy(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::undefined:
    case K::none:
      return false;
    case K::boolean:
      return v.b;
    case K::integer:
      return v.i != 0;
    case K::real:
      return v.d != 0;
    case K::string:
      return !v.s.empty();
    case K::list:
      return v.generator || !v.list->empty();  // a generator object is always true
    case K::dict:
      return !v.dict->items.empty();
    default:
      return true;
  }
}

namespace {

double number(const Value& v) {
  return v.kind == Value::Kind::real      ? v.d
         : v.kind == Value::Kind::boolean ? double(v.b)
                                          : double(v.i);
}

bool dicts_equal(const Dict& a, const Dict& b) {
  if (a.items.size() != b.items.size()) return false;
  for (const auto& [k, v] : a.items) {
    const Value* o = b.find(k);
    if (!o || !equal(v, *o)) return false;
  }
  return true;
}

}  // namespace

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind != K::real && b.kind != K::real)
      return (a.kind == K::boolean ? int64_t(a.b) : a.i) ==
             (b.kind == K::boolean ? int64_t(b.b) : b.i);
    return number(a) == number(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::undefined:
    case K::none:
      return true;
    case K::string:
      return a.s == b.s;
    case K::list:
      if (a.generator || b.generator) return a.list == b.list;
      return a.tuple == b.tuple && a.list->size() == b.list->size() &&
             std::equal(a.list->begin(), a.list->end(), b.list->begin(), equal);
    case K::dict:
      return dicts_equal(*a.dict, *b.dict);
    default:
      return a.dict == b.dict && a.fn == b.fn;  // namespaces and functions: identity
  }
}

std::string type_name(const Value& v) {
  if (v.kind == Value::Kind::list && v.generator) return "generator";
  static const char* kNames[] = {"Undefined", "NoneType", "bool", "int",       "float",
                                 "str",       "list",     "dict", "Namespace", "function"};
  return kNames[int(v.kind)];
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  // The shortest digits that read back to d, placed as Python's repr places
  // them: positional for exponents -4..15, else scientific with 2+ digits.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, std::abs(d), std::chars_format::scientific);
  const std::string sci(buf, r.ptr);
  const size_t e_at = sci.find('e');
  std::string digits = sci.substr(0, e_at);
  std::erase(digits, '.');
  const int exp = std::stoi(sci.substr(e_at + 1));
  const int n = int(digits.size());
  std::string out = std::signbit(d) ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp >= n - 1) {
      out += digits + std::string(size_t(exp + 1 - n), '0') + ".0";
    } else if (exp < 0) {
      out += "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else {
      out += digits.substr(0, size_t(exp + 1)) + "." + digits.substr(size_t(exp + 1));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (n > 1) out.append(".").append(digits, 1);
  return out + fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
}

std::u32string code_points(std::string_view s) {
  std::u32string out;
  if (!decode_utf8(s, out)) py_error("a string is not valid UTF-8");
  return out;
}

std::string utf8(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::u32string cps = code_points(s);
  const bool ws = chars.kind == Value::Kind::undefined || chars.kind == Value::Kind::none;
  if (!ws && !chars.is_string()) py_error("strip arg must be None or str");
  const std::u32string set = ws ? U"" : code_points(chars.s);
  auto strip = [&](char32_t c) { return ws ? py_isspace(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip(cps[b])) ++b;
  if (right)
    while (e > b && strip(cps[e - 1])) --e;
  return utf8(cps.substr(b, e - b));
}

namespace {

bool printable(char32_t c) {
  if (c == ' ') return true;
  const auto cat = utf8proc_category(utf8proc_int32_t(c));
  return !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
           cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
           cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
           cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS);
}

std::string string_repr(const std::string& s) {
  const char quote =
      (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : code_points(s)) {
    if (c == char32_t(quote) || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\t' || c == '\n' || c == '\r') {
      out += c == '\t' ? "\\t" : c == '\n' ? "\\n" : "\\r";
    } else if (c < 0x7F && c >= 0x20) {
      out += char(c);
    } else if (c >= 0x80 && printable(c)) {
      append_utf8(out, c);
    } else {
      out += c <= 0xFF     ? fmt::format("\\x{:02x}", uint32_t(c))
             : c <= 0xFFFF ? fmt::format("\\u{:04x}", uint32_t(c))
                           : fmt::format("\\U{:08x}", uint32_t(c));
    }
  }
  return out + quote;
}

std::string dict_repr(const Dict& d) {
  std::string out = "{";
  for (size_t k = 0; k < d.items.size(); ++k) {
    if (k) out += ", ";
    out += string_repr(d.items[k].first) + ": " + to_repr(d.items[k].second);
  }
  return out + "}";
}

}  // namespace

std::string to_repr(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::string:
      return string_repr(v.s);
    case K::undefined:
      return "Undefined";
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::undefined:
      return "";
    case K::none:
      return "None";
    case K::boolean:
      return v.b ? "True" : "False";
    case K::integer:
      return std::to_string(v.i);
    case K::real:
      return float_repr(v.d);
    case K::string:
      return v.s;
    case K::list: {
      // Python prints "<generator object ... at 0x...>": refused rather than faked.
      if (v.generator) py_error("cannot print a generator (map, select...): add '| list'");
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + to_repr((*v.list)[k]);
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case K::dict:
      return dict_repr(*v.dict);
    case K::ns:
      return "<Namespace " + dict_repr(*v.dict) + ">";
    case K::function:
      return "<function>";
  }
  return "";
}

namespace {

std::string json_string(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  for (char32_t c : code_points(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c > 0x7E && c != 0x7F)) {
          if (c > 0xFFFF) {
            const char32_t u = c - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", uint32_t(c));
          }
        } else {
          append_utf8(out, c);
        }
    }
  }
  return out + "\"";
}

struct JsonWriter {
  bool ensure_ascii;
  int indent;
  bool sort_keys;

  // json.dumps with an indent: a newline and indent * level spaces.
  std::string newline(int level) const {
    if (indent < 0) return {};
    std::string s(size_t(indent * level) + 1, ' ');
    s[0] = '\n';
    return s;
  }
  std::string item_sep(int level) const {
    return indent < 0 ? std::string(", ") : std::string(",").append(newline(level));
  }

  std::string write(const Value& v, int level) const {
    using K = Value::Kind;
    switch (v.kind) {
      case K::none:
        return "null";
      case K::boolean:
        return v.b ? "true" : "false";
      case K::integer:
        return std::to_string(v.i);
      case K::real:
        if (std::isnan(v.d)) return "NaN";
        if (std::isinf(v.d)) return v.d < 0 ? "-Infinity" : "Infinity";
        return float_repr(v.d);
      case K::string:
        return json_string(v.s, ensure_ascii);
      case K::list: {
        if (v.generator) py_error("Object of type generator is not JSON serializable");
        if (v.list->empty()) return "[]";
        std::string out = std::string("[").append(newline(level + 1));
        for (size_t k = 0; k < v.list->size(); ++k)
          out += (k ? item_sep(level + 1) : "") + write((*v.list)[k], level + 1);
        return out + newline(level) + "]";
      }
      case K::dict:
        return write_dict(*v.dict, level);
      default:
        py_error(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
    }
  }

  std::string write_dict(const Dict& d, int level) const {
    if (d.items.empty()) return "{}";
    std::vector<const std::pair<std::string, Value>*> items;
    for (const auto& kv : d.items) items.push_back(&kv);
    if (sort_keys)
      std::stable_sort(items.begin(), items.end(),
                       [](auto* a, auto* b) { return a->first < b->first; });
    std::string out = std::string("{").append(newline(level + 1));
    for (size_t k = 0; k < items.size(); ++k)
      out += (k ? item_sep(level + 1) : "") + json_string(items[k]->first, ensure_ascii) + ": " +
             write(items[k]->second, level + 1);
    return out + newline(level) + "}";
  }
};

}  // namespace

std::string to_json(const Value& v, bool ensure_ascii, int indent, bool sort_keys) {
  return JsonWriter{ensure_ascii, indent, sort_keys}.write(v, 0);
}

std::vector<Value> iterate(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::undefined:
      return {};
    case K::list:
      return *v.list;
    case K::dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case K::string: {
      std::vector<Value> chars;
      for (char32_t c : code_points(v.s))
        chars.push_back(Value::string(utf8(std::u32string(1, c))));
      return chars;
    }
    default:
      py_error(fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

int64_t py_len(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::undefined:
      return 0;
    case K::string:
      return int64_t(code_points(v.s).size());
    case K::list:
      if (v.generator) break;
      return int64_t(v.list->size());
    case K::dict:
      return int64_t(v.dict->items.size());
    default:
      break;
  }
  py_error(fmt::format("object of type '{}' has no len()", type_name(v)));
}

}  // namespace redco::data::chat_detail
