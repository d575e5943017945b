// The chat template's methods and tests: the Python str/dict methods a
// sandboxed template may call, subscripts and attributes as jinja2's
// environment resolves them, and jinja2 3.1's tests, each as CPython and
// jinja2 implement them (str.title is not the `title` filter).
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "redco/data/chat_template_ast.hpp"
#include "redco/data/utf8.hpp"

namespace redco::data::chat_detail {

using K = Value::Kind;

namespace {

std::string map_case(const std::string& s, utf8proc_int32_t (*f)(utf8proc_int32_t)) {
  std::u32string cps = code_points(s);
  for (char32_t& c : cps) c = char32_t(f(utf8proc_int32_t(c)));
  return utf8(cps);
}
}  // namespace

std::string upper(const std::string& s) { return map_case(s, utf8proc_toupper); }
std::string lower(const std::string& s) { return map_case(s, utf8proc_tolower); }

namespace {

bool is_cased(char32_t c) {
  const auto cat = utf8proc_category(utf8proc_int32_t(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

// str.title(): a cased character after a cased one is lowered, others titled.
std::string py_title(const std::string& s) {
  std::u32string cps = code_points(s);
  bool prev_cased = false;
  for (char32_t& c : cps) {
    const char32_t orig = c;
    c = char32_t(prev_cased ? utf8proc_tolower(utf8proc_int32_t(c))
                            : utf8proc_totitle(utf8proc_int32_t(c)));
    prev_cased = is_cased(orig);
  }
  return utf8(cps);
}

}  // namespace

std::string py_capitalize(const std::string& s) {
  std::u32string cps = code_points(s);
  for (size_t k = 0; k < cps.size(); ++k)
    cps[k] = char32_t(k == 0 ? utf8proc_totitle(utf8proc_int32_t(cps[k]))
                             : utf8proc_tolower(utf8proc_int32_t(cps[k])));
  return utf8(cps);
}

// jinja2's title filter: each piece after [-\s({\[<]+ starts upper, the rest lower.
std::string jinja_title(const std::string& s) {
  std::u32string cps = code_points(s);
  bool start = true;
  for (char32_t& c : cps) {
    const bool sep = py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    c = char32_t(start || sep ? utf8proc_toupper(utf8proc_int32_t(c))
                              : utf8proc_tolower(utf8proc_int32_t(c)));
    start = sep;
  }
  return utf8(cps);
}

std::string need_str(const Value& v, std::string_view what) {
  if (!v.is_string()) py_error(fmt::format("{} expects a string, got {}", what, type_name(v)));
  return v.s;
}

int64_t need_int(const Value& v, std::string_view what) {
  if (v.kind == K::integer) return v.i;
  if (v.kind == K::boolean) return v.b;
  py_error(fmt::format("{} expects an integer, got {}", what, type_name(v)));
}

// str.replace(old, new, count): an empty `old` inserts between code points.
std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count) {
  std::string out;
  if (from.empty()) {
    const std::u32string cps = code_points(s);
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || int64_t(k) < count) out += to;
      if (k < cps.size()) append_utf8(out, cps[k]);
    }
    return out;
  }
  size_t at = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t hit = s.find(from, at);
    if (hit == std::string::npos) break;
    out += s.substr(at, hit - at) + to;
    at = hit + from.size();
  }
  return out + s.substr(at);
}

namespace {

// str.split(sep=None, maxsplit=-1).
Value py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List parts;
  if (sep.kind == K::undefined || sep.kind == K::none) {
    const std::u32string cps = code_points(s);
    size_t k = 0;
    while (true) {
      while (k < cps.size() && py_isspace(cps[k])) ++k;
      if (k == cps.size()) break;
      if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > k && py_isspace(cps[e - 1])) --e;
        parts.push_back(Value::string(utf8(cps.substr(k, e - k))));
        break;
      }
      const size_t b = k;
      while (k < cps.size() && !py_isspace(cps[k])) ++k;
      parts.push_back(Value::string(utf8(cps.substr(b, k - b))));
    }
    return Value::make_list(std::move(parts));
  }
  const std::string d = need_str(sep, "split");
  if (d.empty()) py_error("empty separator");
  size_t at = 0;
  for (size_t hit; (maxsplit < 0 || int64_t(parts.size()) < maxsplit) &&
                   (hit = s.find(d, at)) != std::string::npos;
       at = hit + d.size())
    parts.push_back(Value::string(s.substr(at, hit - at)));
  parts.push_back(Value::string(s.substr(at)));
  return Value::make_list(std::move(parts));
}

bool affix(const std::string& s, const Value& what, bool prefix) {
  auto one = [&](const Value& a) {
    const std::string x = need_str(a, prefix ? "startswith" : "endswith");
    return prefix ? s.starts_with(x) : s.ends_with(x);
  };
  if (what.kind == K::list) return std::any_of(what.list->begin(), what.list->end(), one);
  return one(what);
}

Value string_method(const std::string& s, const std::string& name, Args& a) {
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Value::string(py_strip(s, a.take(0, "chars"), name != "rstrip", name != "lstrip"));
  if (name == "split") {
    const Value sep = a.take(0, "sep");
    return py_split(s, sep, need_int(a.take(1, "maxsplit", Value::integer(-1)), "split"));
  }
  if (name == "startswith" || name == "endswith")
    return Value::boolean(affix(s, a.take(0, "prefix"), name == "startswith"));
  if (name == "upper") return Value::string(upper(s));
  if (name == "lower") return Value::string(lower(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "replace") {
    const std::string from = need_str(a.take(0, "old"), "replace");
    const std::string to = need_str(a.take(1, "new"), "replace");
    return Value::string(
        py_replace(s, from, to, need_int(a.take(2, "count", Value::integer(-1)), "replace")));
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const Value& x : iterate(a.take(0, "iterable"))) {
      out += (first ? "" : s) + need_str(x, "join");
      first = false;
    }
    return Value::string(out);
  }
  if (name == "find" || name == "count") {
    const std::string sub = need_str(a.take(0, "sub"), name);
    if (name == "find") {
      const size_t at = s.find(sub);
      return Value::integer(at == std::string::npos ? -1
                                                    : int64_t(code_points(s.substr(0, at)).size()));
    }
    int64_t n = 0;
    if (sub.empty()) return Value::integer(int64_t(code_points(s).size()) + 1);
    for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
    return Value::integer(n);
  }
  py_error(fmt::format("'str' object has no supported method '{}'", name));
}

Value dict_method(const Dict& d, const std::string& name, Args& a) {
  if (name == "items" || name == "keys" || name == "values") {
    List out;
    for (const auto& [k, v] : d.items) {
      if (name == "items")
        out.push_back(Value::make_tuple({Value::string(k), v}));
      else
        out.push_back(name == "keys" ? Value::string(k) : v);
    }
    return Value::make_list(std::move(out));
  }
  if (name == "get") {
    const Value key = a.take(0, "key");
    const Value fallback = a.take(1, "default", Value::none());
    const Value* v = key.is_string() ? d.find(key.s) : nullptr;
    return v ? *v : fallback;
  }
  py_error(fmt::format("'dict' object has no supported method '{}'", name));
}

}  // namespace

Value call_method(const Value& obj, const std::string& name, Args& args, Where) {
  Value out;
  if (obj.is_string()) {
    out = string_method(obj.s, name, args);
  } else if (obj.kind == K::dict) {
    out = dict_method(*obj.dict, name, args);
  } else if (obj.is_undefined()) {
    py_error(obj.s.empty() ? "undefined value has no attribute '" + name + "'" : obj.s);
  } else {
    py_error(fmt::format("'{}' object has no supported method '{}'", type_name(obj), name));
  }
  args.check_consumed(name);
  return out;
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) py_error(obj.s.empty() ? "undefined value is not subscriptable" : obj.s);
  if (((obj.kind == K::list && !obj.generator) || obj.is_string()) &&
      (key.kind == K::integer || key.kind == K::boolean)) {
    int64_t i = key.kind == K::boolean ? key.b : key.i;
    if (obj.kind == K::list) {
      const int64_t n = int64_t(obj.list->size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return (*obj.list)[size_t(i)];
    } else {
      const std::u32string cps = code_points(obj.s);
      const int64_t n = int64_t(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::string(utf8(cps.substr(size_t(i), 1)));
    }
    return Value::undefined(fmt::format("'{} object' has no element {}", type_name(obj), key.i));
  }
  if ((obj.kind == K::dict || obj.kind == K::ns) && key.is_string()) {
    if (const Value* v = obj.dict->find(key.s)) return *v;
  }
  return Value::undefined(
      fmt::format("'{} object' has no attribute {}", type_name(obj), to_repr(key)));
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined())
    py_error(obj.s.empty() ? "undefined value has no attribute '" + name + "'" : obj.s);
  if (obj.kind == K::dict || obj.kind == K::ns)
    if (const Value* v = obj.dict->find(name)) return *v;
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", type_name(obj), name));
}

// selectattr / map(attribute=): "a.b.0" through getitem at each dot.
Value attr_path(const Value& v, const Value& attr) {
  if (!attr.is_string()) return get_item(v, attr);
  Value cur = v;
  size_t at = 0;
  while (true) {
    const size_t dot = attr.s.find('.', at);
    const std::string part =
        attr.s.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = get_item(cur, digits ? Value::integer(std::stoll(part)) : Value::string(part));
    if (dot == std::string::npos) return cur;
    at = dot + 1;
  }
}

namespace {

bool compare_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    auto num = [](const Value& v) {
      return v.kind == K::real ? v.d : double(v.kind == K::boolean ? v.b : v.i);
    };
    return num(a) < num(b);
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;
  py_error(fmt::format("'<' not supported between instances of '{}' and '{}'", type_name(a),
                       type_name(b)));
}

using TestFn = bool (*)(const Value&, Args&);
const std::map<std::string, TestFn, std::less<>>& tests() {
  static const std::map<std::string, TestFn, std::less<>> t = {
      {"defined", [](const Value& v, Args&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, Args&) { return v.is_undefined(); }},
      {"none", [](const Value& v, Args&) { return v.kind == K::none; }},
      {"string", [](const Value& v, Args&) { return v.is_string(); }},
      {"mapping", [](const Value& v, Args&) { return v.kind == K::dict; }},
      {"iterable",
       [](const Value& v, Args&) {
         return v.kind == K::undefined || v.is_string() || v.kind == K::list || v.kind == K::dict;
       }},
      {"sequence",
       [](const Value& v, Args&) {
         return v.kind == K::undefined || v.is_string() || v.kind == K::list || v.kind == K::dict;
       }},
      {"number", [](const Value& v, Args&) { return v.is_number(); }},
      {"integer", [](const Value& v, Args&) { return v.kind == K::integer; }},
      {"float", [](const Value& v, Args&) { return v.kind == K::real; }},
      {"boolean", [](const Value& v, Args&) { return v.kind == K::boolean; }},
      {"true", [](const Value& v, Args&) { return v.kind == K::boolean && v.b; }},
      {"false", [](const Value& v, Args&) { return v.kind == K::boolean && !v.b; }},
      {"callable", [](const Value& v, Args&) { return v.kind == K::function; }},
      {"lower", [](const Value& v, Args&) { return v.is_string() && lower(v.s) == v.s; }},
      {"upper", [](const Value& v, Args&) { return v.is_string() && upper(v.s) == v.s; }},
      {"odd", [](const Value& v, Args&) { return need_int(v, "odd") % 2 != 0; }},
      {"even", [](const Value& v, Args&) { return need_int(v, "even") % 2 == 0; }},
      {"divisibleby",
       [](const Value& v, Args& a) {
         const int64_t n = need_int(a.take(0, "num"), "divisibleby");
         return n != 0 && need_int(v, "divisibleby") % n == 0;
       }},
      {"eq", [](const Value& v, Args& a) { return equal(v, a.take(0, "other")); }},
      {"ne", [](const Value& v, Args& a) { return !equal(v, a.take(0, "other")); }},
      {"lt", [](const Value& v, Args& a) { return compare_less(v, a.take(0, "other")); }},
      {"gt", [](const Value& v, Args& a) { return compare_less(a.take(0, "other"), v); }},
      {"le", [](const Value& v, Args& a) { return !compare_less(a.take(0, "other"), v); }},
      {"ge", [](const Value& v, Args& a) { return !compare_less(v, a.take(0, "other")); }},
      {"sameas",
       [](const Value& v, Args& a) {
         const Value o = a.take(0, "other");
         return v.kind == o.kind && (v.kind == K::none || v.kind == K::undefined || equal(v, o));
       }},
      {"in",
       [](const Value& v, Args& a) {
         const Value seq = a.take(0, "seq");
         if (seq.is_string()) return v.is_string() && seq.s.find(v.s) != std::string::npos;
         if (seq.kind == K::dict) return v.is_string() && seq.dict->find(v.s) != nullptr;
         for (const Value& x : iterate(seq))
           if (equal(x, v)) return true;
         return false;
       }},
  };
  return t;
}

std::string test_name(const std::string& name) {
  static const std::map<std::string, std::string, std::less<>> kAliases = {
      {"equalto", "eq"}, {"==", "eq"}, {"!=", "ne"},          {"<", "lt"},       {">", "gt"},
      {"<=", "le"},      {">=", "ge"}, {"greaterthan", "gt"}, {"lessthan", "lt"}};
  const auto it = kAliases.find(name);
  return it == kAliases.end() ? name : it->second;
}

}  // namespace

bool has_test(std::string_view name) { return tests().contains(test_name(std::string(name))); }

bool apply_test(const std::string& name, const Value& v, Args& args, Where) {
  const auto it = tests().find(test_name(name));
  if (it == tests().end()) py_error(fmt::format("no test named '{}'", name));
  const bool r = it->second(v, args);
  args.check_consumed("test " + name);
  return r;
}

}  // namespace redco::data::chat_detail
