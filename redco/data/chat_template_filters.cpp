// The chat template's filters: jinja2 3.1's built-ins that chat templates
// use, each with jinja2's argument names and defaults, plus transformers'
// tojson (json.dumps with ensure_ascii=False, not jinja2's HTML-safe one).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include "redco/data/chat_template_ast.hpp"
#include "redco/data/utf8.hpp"

namespace redco::data::chat_detail {

namespace {

using K = Value::Kind;
using FilterFn = Value (*)(const Value&, Args&);

// soft_str: what a filter that wants text makes of any value.
std::string text(const Value& v) { return to_str(v); }

Value str_filter(std::string (*f)(const std::string&), const Value& v) {
  return Value::string(f(text(v)));
}

Value join(const Value& v, Args& a) {
  const std::string sep = text(a.take(0, "d", Value::string("")));
  const Value attr = a.take(1, "attribute", Value::none());
  std::string out;
  bool first = true;
  for (const Value& x : iterate(v)) {
    out += (first ? "" : sep) + text(attr.kind == K::none ? x : attr_path(x, attr));
    first = false;
  }
  return Value::string(out);
}

Value tojson(const Value& v, Args& a) {
  const bool ascii = truthy(a.take(0, "ensure_ascii", Value::boolean(false)));
  const Value indent = a.take(1, "indent", Value::none());
  const Value separators = a.take(2, "separators", Value::none());
  const bool sort_keys = truthy(a.take(3, "sort_keys", Value::boolean(false)));
  if (separators.kind != K::none) py_error("tojson: separators are not supported");
  const int width = indent.kind == K::none ? -1 : int(need_int(indent, "tojson indent"));
  return Value::string(to_json(v, ascii, width, sort_keys));
}

// int(x): ints as they are, floats truncated, strings parsed as Python's
// int() (then float()) parses them, anything else `default`.
Value to_int(const Value& v, Args& a) {
  const Value fallback = a.take(0, "default", Value::integer(0));
  const int base = int(need_int(a.take(1, "base", Value::integer(10)), "int"));
  if (v.kind == K::integer || v.kind == K::boolean)
    return Value::integer(v.kind == K::boolean ? v.b : v.i);
  if (v.kind == K::real) return std::isfinite(v.d) ? Value::integer(int64_t(v.d)) : fallback;
  if (!v.is_string()) return fallback;
  std::string s = py_strip(v.s, Value::none(), true, true);
  std::erase(s, '_');
  if (s.empty()) return fallback;
  char* end = nullptr;
  const long long i = std::strtoll(s.c_str(), &end, base);
  if (end == s.c_str() + s.size()) return Value::integer(i);
  const double d = std::strtod(s.c_str(), &end);
  if (end == s.c_str() + s.size() && std::isfinite(d)) return Value::integer(int64_t(d));
  return fallback;
}

Value to_float(const Value& v, Args& a) {
  const Value fallback = a.take(0, "default", Value::real(0.0));
  if (v.is_number())
    return Value::real(v.kind == K::real ? v.d : double(v.kind == K::boolean ? v.b : v.i));
  if (!v.is_string()) return fallback;
  const std::string s = py_strip(v.s, Value::none(), true, true);
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size() ? Value::real(d) : fallback;
}

Value items(const Value& v, Args&) {
  if (v.is_undefined()) return Value::make_list();
  if (v.kind != K::dict) py_error("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, x] : v.dict->items) out.push_back(Value::make_tuple({Value::string(k), x}));
  return Value::make_list(std::move(out));
}

// select / reject / selectattr / rejectattr: keep items whose (attribute's)
// test passes (or fails); without a test name, whose value is true.
Value select(const Value& v, Args& a, bool by_attr, bool keep) {
  const Value attr = by_attr ? a.take(0, "attribute") : Value::none();
  const size_t first = by_attr ? 1 : 0;
  const Value test = a.pos.size() > first ? a.pos[first] : Value::none();
  List out;
  // jinja2's select_or_reject skips a false sequence (none) instead of iterating it.
  for (const Value& x : truthy(v) ? iterate(v) : List{}) {
    const Value subject = by_attr ? attr_path(x, attr) : x;
    bool pass;
    if (test.kind == K::none) {
      pass = truthy(subject);
    } else {
      Args targs;
      targs.pos.assign(a.pos.begin() + long(first + 1), a.pos.end());
      pass = apply_test(need_str(test, "select"), subject, targs, {});
    }
    if (pass == keep) out.push_back(x);
  }
  a.taken_pos = a.pos.size();
  return Value::make_generator(std::move(out));
}

Value map_filter(const Value& v, Args& a) {
  List out;
  const List seq = truthy(v) ? iterate(v) : List{};  // as jinja2's do_map: none maps to nothing
  if (std::any_of(a.kw.begin(), a.kw.end(), [](auto& kv) { return kv.first == "attribute"; })) {
    const Value attr = a.take(size_t(-1), "attribute");
    const Value fallback = a.take(size_t(-1), "default");
    for (const Value& x : seq) {
      Value y = attr_path(x, attr);
      out.push_back(y.is_undefined() && !fallback.is_undefined() ? fallback : y);
    }
    return Value::make_generator(std::move(out));
  }
  const std::string name = need_str(a.take(0, "name"), "map");
  for (const Value& x : seq) {
    Args fargs;
    fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
    fargs.kw = a.kw;
    out.push_back(apply_filter(name, x, fargs, {}));
  }
  a.taken_pos = a.pos.size();
  a.kw.clear();
  return Value::make_generator(std::move(out));
}

// indent(width=4, first=False, blank=False), splitting as str.splitlines.
Value indent(const Value& v, Args& a) {
  const Value width = a.take(0, "width", Value::integer(4));
  const bool first = truthy(a.take(1, "first", Value::boolean(false)));
  const bool blank = truthy(a.take(2, "blank", Value::boolean(false)));
  const std::string pad =
      width.is_string() ? width.s : std::string(size_t(need_int(width, "indent")), ' ');
  std::vector<std::string> lines;
  std::string line;
  const std::u32string cps = code_points(text(v) + "\n");
  for (size_t k = 0; k < cps.size(); ++k) {
    const char32_t c = cps[k];
    if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
        c == 0x2028 || c == 0x2029) {
      if (c == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') ++k;
      lines.push_back(std::exchange(line, {}));
    } else {
      append_utf8(line, c);
    }
  }
  if (!line.empty()) lines.push_back(line);
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k) out += "\n";
    const bool pad_it = k == 0 ? first : (blank || !lines[k].empty());
    out += (pad_it ? pad : "") + lines[k];
  }
  if (blank && first && lines.empty()) out = pad;
  return Value::string(out);
}

Value first_or_last(const Value& v, bool first) {
  std::vector<Value> xs = iterate(v);
  if (v.is_undefined() && !first) py_error("undefined value has no last item");
  if (xs.empty())
    return Value::undefined(first ? "No first item, sequence was empty."
                                  : "No last item, sequence was empty.");
  return first ? xs.front() : xs.back();
}

Value reverse(const Value& v, Args&) {
  if (v.is_string()) {
    std::u32string cps = code_points(v.s);
    std::reverse(cps.begin(), cps.end());
    return Value::string(utf8(cps));
  }
  List xs = iterate(v);
  std::reverse(xs.begin(), xs.end());
  return Value::make_list(std::move(xs));
}

const std::map<std::string, FilterFn, std::less<>>& filters() {
  static const std::map<std::string, FilterFn, std::less<>> f = {
      {"trim",
       [](const Value& v, Args& a) {
         return Value::string(py_strip(text(v), a.take(0, "chars"), true, true));
       }},
      {"upper", [](const Value& v, Args&) { return str_filter(upper, v); }},
      {"lower", [](const Value& v, Args&) { return str_filter(lower, v); }},
      {"capitalize", [](const Value& v, Args&) { return str_filter(py_capitalize, v); }},
      {"title", [](const Value& v, Args&) { return str_filter(jinja_title, v); }},
      {"length", [](const Value& v, Args&) { return Value::integer(py_len(v)); }},
      {"count", [](const Value& v, Args&) { return Value::integer(py_len(v)); }},
      {"first", [](const Value& v, Args&) { return first_or_last(v, true); }},
      {"last", [](const Value& v, Args&) { return first_or_last(v, false); }},
      {"join", join},
      {"replace",
       [](const Value& v, Args& a) {
         const std::string from = text(a.take(0, "old")), to = text(a.take(1, "new"));
         const Value count = a.take(2, "count", Value::none());
         return Value::string(py_replace(text(v), from, to,
                                         count.kind == K::none ? -1 : need_int(count, "replace")));
       }},
      {"default",
       [](const Value& v, Args& a) {
         const Value fallback = a.take(0, "default_value", Value::string(""));
         const bool boolean = truthy(a.take(1, "boolean", Value::boolean(false)));
         return v.is_undefined() || (boolean && !truthy(v)) ? fallback : v;
       }},
      {"tojson", tojson},
      {"string", [](const Value& v, Args&) { return Value::string(text(v)); }},
      {"int", to_int},
      {"float", to_float},
      {"list", [](const Value& v, Args&) { return Value::make_list(iterate(v)); }},
      {"items", items},
      {"selectattr", [](const Value& v, Args& a) { return select(v, a, true, true); }},
      {"rejectattr", [](const Value& v, Args& a) { return select(v, a, true, false); }},
      {"select", [](const Value& v, Args& a) { return select(v, a, false, true); }},
      {"reject", [](const Value& v, Args& a) { return select(v, a, false, false); }},
      {"map", map_filter},
      {"indent", indent},
      {"reverse", reverse},
      {"safe", [](const Value& v, Args&) { return v; }},
      {"abs",
       [](const Value& v, Args&) {
         if (v.kind == K::real) return Value::real(std::abs(v.d));
         return Value::integer(std::abs(need_int(v, "abs")));
       }},
  };
  return f;
}

std::string filter_name(std::string_view name) {
  if (name == "d") return "default";
  if (name == "e" || name == "escape") return "(unsupported)";
  return std::string(name);
}

}  // namespace

bool has_filter(std::string_view name) { return filters().contains(filter_name(name)); }

Value apply_filter(const std::string& name, Value v, Args& args, Where) {
  const auto it = filters().find(filter_name(name));
  if (it == filters().end()) py_error(fmt::format("no filter named '{}'", name));
  Value out = it->second(v, args);
  args.check_consumed("filter " + name);
  return out;
}

}  // namespace redco::data::chat_detail
