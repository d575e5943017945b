// data::ChatTemplate's evaluator: statements and expressions over the parsed
// template (chat_template_parse.cpp) with jinja2's scoping (a for loop's body
// is a fresh scope each iteration, an if's is not, a macro sees the
// template's top level) and transformers' globals.
#include "redco/data/chat_template.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>

#include "redco/data/chat_template_ast.hpp"

namespace redco::data {

namespace chat_detail {

namespace {

using K = Value::Kind;

struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(std::string_view name) const {
    for (const Scope* s = this; s; s = s->parent)
      for (const auto& [k, v] : s->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, x] : vars)
      if (k == name) {
        x = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};

enum class Flow { normal, break_, continue_ };

int64_t as_int(const Value& v) { return v.kind == K::boolean ? v.b : v.i; }
double as_double(const Value& v) { return v.kind == K::real ? v.d : double(as_int(v)); }

[[noreturn]] void undefined_error(const Value& v) {
  py_error(v.s.empty() ? "value is undefined" : v.s);
}

[[noreturn]] void operand_error(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  py_error(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a),
                       type_name(b)));
}

Value repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += seq.s;
    return Value::string(out);
  }
  List out;
  for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return Value::make_list(std::move(out));
}

// Python's int and float arithmetic for + - * / // % **.
Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  const bool ints = a.kind != K::real && b.kind != K::real;
  const int64_t x = as_int(a), y = as_int(b);
  const double p = as_double(a), q = as_double(b);
  if ((op == "/" || op == "//" || op == "%") && q == 0) py_error("division by zero");
  if (op == "+") return ints ? Value::integer(x + y) : Value::real(p + q);
  if (op == "-") return ints ? Value::integer(x - y) : Value::real(p - q);
  if (op == "*") return ints ? Value::integer(x * y) : Value::real(p * q);
  if (op == "/") return Value::real(p / q);
  if (op == "//") {
    if (!ints) return Value::real(std::floor(p / q));
    return Value::integer(x / y - ((x % y != 0 && (x < 0) != (y < 0)) ? 1 : 0));
  }
  if (op == "%") {
    if (!ints) {
      const double r = std::fmod(p, q);
      return Value::real(r != 0 && (r < 0) != (q < 0) ? r + q : r);
    }
    const int64_t r = x % y;
    return Value::integer(r != 0 && (r < 0) != (y < 0) ? r + y : r);
  }
  if (ints && y >= 0) {
    int64_t r = 1;
    for (int64_t k = 0; k < y; ++k) r *= x;
    return Value::integer(r);
  }
  return Value::real(std::pow(p, q));
}

Value binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value::string(to_str(a) + to_str(b));
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  if (op == "+" && a.kind == b.kind && a.is_string()) return Value::string(a.s + b.s);
  if (op == "+" && a.kind == b.kind && a.kind == K::list) {
    List out = *a.list;
    out.insert(out.end(), b.list->begin(), b.list->end());
    return Value::make_list(std::move(out));
  }
  if (op == "*" && (a.is_string() || a.kind == K::list) &&
      (b.kind == K::integer || b.kind == K::boolean))
    return repeat(a, as_int(b));
  if (op == "*" && (b.is_string() || b.kind == K::list) &&
      (a.kind == K::integer || a.kind == K::boolean))
    return repeat(b, as_int(a));
  if (op == "%" && a.is_string()) py_error("printf-style string formatting is not supported");
  operand_error(op, a, b);
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return as_double(a) < as_double(b);
  if (a.is_string() && b.is_string()) return a.s < b.s;
  if (a.kind == K::list && b.kind == K::list)
    return std::lexicographical_compare(a.list->begin(), a.list->end(), b.list->begin(),
                                        b.list->end(), less);
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  py_error(fmt::format("'<' not supported between instances of '{}' and '{}'", type_name(a),
                       type_name(b)));
}

bool contains(const Value& seq, const Value& x) {
  if (seq.is_string()) {
    if (!x.is_string())
      py_error(fmt::format("'in <string>' requires string as left operand, not {}", type_name(x)));
    return seq.s.find(x.s) != std::string::npos;
  }
  if (seq.kind == K::dict) return x.is_string() && seq.dict->find(x.s);
  for (const Value& y : iterate(seq))
    if (equal(x, y)) return true;
  return false;
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "<") return less(a, b);
  if (op == ">") return less(b, a);
  if (op == "<=") return !less(b, a);
  if (op == ">=") return !less(a, b);
  if (op == "in") return contains(b, a);
  return !contains(b, a);  // notin
}

// obj[start:stop:step] with Python's index adjustment.
Value slice(const Value& obj, const Value* bounds[3]) {
  if (obj.is_undefined()) undefined_error(obj);
  const bool str = obj.is_string();
  if (!str && obj.kind != K::list)
    py_error(fmt::format("'{}' object is not sliceable", type_name(obj)));
  const std::u32string cps = str ? code_points(obj.s) : std::u32string();
  const int64_t n = str ? int64_t(cps.size()) : int64_t(obj.list->size());
  auto given = [&](int k) { return bounds[k] && bounds[k]->kind != K::none; };
  const int64_t step = given(2) ? need_int(*bounds[2], "slice step") : 1;
  if (step == 0) py_error("slice step cannot be zero");
  auto adjust = [&](int k, int64_t fallback) {
    if (!given(k)) return fallback;
    int64_t i = need_int(*bounds[k], "slice index");
    if (i < 0) i = std::max<int64_t>(i + n, step < 0 ? -1 : 0);
    return std::min<int64_t>(i, step < 0 ? n - 1 : n);
  };
  const int64_t start = adjust(0, step < 0 ? n - 1 : 0), stop = adjust(1, step < 0 ? -1 : n);
  std::u32string s;
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (str)
      s += cps[size_t(i)];
    else
      out.push_back((*obj.list)[size_t(i)]);
  }
  return str ? Value::string(utf8(s)) : Value::make_list(std::move(out));
}

Value range(Args& a) {
  std::vector<int64_t> v;
  for (const Value& x : a.pos) v.push_back(need_int(x, "range"));
  a.taken_pos = a.pos.size();
  if (v.empty() || v.size() > 3) py_error("range expects 1 to 3 integer arguments");
  const int64_t start = v.size() > 1 ? v[0] : 0, stop = v.size() > 1 ? v[1] : v[0];
  const int64_t step = v.size() > 2 ? v[2] : 1;
  if (step == 0) py_error("range() arg 3 must not be zero");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (out.size() >= 100000) py_error("range too big, maximum size for range is 100000");
    out.push_back(Value::integer(i));
  }
  return Value::make_list(std::move(out));
}

// namespace(...) and dict(...): an optional mapping, then keyword arguments.
Value make_mapping(Args& a, K kind) {
  Value d = Value::make_dict(kind);
  if (!a.pos.empty()) {
    if (a.pos.size() > 1 || a.pos[0].kind != K::dict) py_error("expects one mapping argument");
    d.dict->items = a.pos[0].dict->items;
    a.taken_pos = 1;
  }
  for (auto& [k, v] : a.kw) d.dict->set(k, v);
  a.kw.clear();
  return d;
}

// transformers' strftime_now: datetime.now().strftime(format), local time.
Value strftime_now(Args& a) {
  const std::string fmt = need_str(a.take(0, "format"), "strftime_now");
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::string buf(fmt.size() * 8 + 64, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  buf.resize(n);
  return Value::string(buf);
}

void add_globals(Scope& g) {
  g.set("raise_exception", Value::function([](Args& a) -> Value {
          throw ChatTemplateException(to_str(a.take(0, "message")));
        }));
  g.set("strftime_now", Value::function(strftime_now));
  g.set("range", Value::function(range));
  g.set("namespace", Value::function([](Args& a) { return make_mapping(a, K::ns); }));
  g.set("dict", Value::function([](Args& a) { return make_mapping(a, K::dict); }));
}

// Runs f, turning a Python-level error into redco::Error naming `w`.
template <typename F>
auto checked(Where w, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const PyError& e) {
    fail_at(w, e.msg);
  }
}

class Renderer {
 public:
  explicit Renderer(Scope& root) : root_(root) {}

  Flow exec(const Body& body, Scope& scope, std::string& out) {
    for (const Node& n : body) {
      const Flow f = exec(n, scope, out);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

 private:
  Flow exec(const Node& n, Scope& scope, std::string& out) {
    switch (n.kind) {
      case Node::Kind::text:
        out += n.text;
        return Flow::normal;
      case Node::Kind::output:
        out += checked(n.where, [&] { return to_str(eval(*n.expr, scope)); });
        return Flow::normal;
      case Node::Kind::if_:
        for (const auto& [cond, body] : n.branches)
          if (truthy(eval(*cond, scope))) return exec(body, scope, out);
        return exec(n.else_body, scope, out);
      case Node::Kind::for_:
        return exec_for(n, scope, out);
      case Node::Kind::set:
        exec_set(n, scope);
        return Flow::normal;
      case Node::Kind::set_block: {
        std::string text;
        exec(n.body, scope, text);
        scope.set(n.targets[0], Value::string(text));
        return Flow::normal;
      }
      case Node::Kind::macro:
        scope.set(n.name, make_macro(n));
        return Flow::normal;
      case Node::Kind::break_:
        return Flow::break_;
      case Node::Kind::continue_:
        return Flow::continue_;
      case Node::Kind::block:
        return exec(n.body, scope, out);
    }
    return Flow::normal;
  }

  void bind(const Node& n, Scope& scope, const Value& item) {
    if (n.targets.size() == 1) {
      scope.set(n.targets[0], item);
      return;
    }
    const std::vector<Value> parts = checked(n.where, [&] { return iterate(item); });
    if (parts.size() != n.targets.size())
      fail_at(n.where, fmt::format("cannot unpack {} values into {} loop variables", parts.size(),
                                   n.targets.size()));
    for (size_t k = 0; k < parts.size(); ++k) scope.set(n.targets[k], parts[k]);
  }

  static Value loop_info(const std::vector<Value>& items, size_t k) {
    Value loop = Value::make_dict();
    const auto n = int64_t(items.size()), i = int64_t(k);
    auto set = [&](const char* key, Value v) { loop.dict->items.emplace_back(key, std::move(v)); };
    set("index", Value::integer(i + 1));
    set("index0", Value::integer(i));
    set("revindex", Value::integer(n - i));
    set("revindex0", Value::integer(n - i - 1));
    set("first", Value::boolean(i == 0));
    set("last", Value::boolean(i == n - 1));
    set("length", Value::integer(n));
    set("depth", Value::integer(1));
    set("depth0", Value::integer(0));
    if (k > 0) set("previtem", items[k - 1]);
    if (k + 1 < items.size()) set("nextitem", items[k + 1]);
    return loop;
  }

  Flow exec_for(const Node& n, Scope& scope, std::string& out) {
    const Value seq = eval(*n.expr, scope);
    std::vector<Value> items = checked(n.where, [&] { return iterate(seq); });
    if (n.filter) {
      std::vector<Value> kept;
      for (const Value& x : items) {
        Scope s{&scope, {}};
        bind(n, s, x);
        if (truthy(eval(*n.filter, s))) kept.push_back(x);
      }
      items = std::move(kept);
    }
    for (size_t k = 0; k < items.size(); ++k) {
      Scope s{&scope, {}};  // fresh each iteration, as jinja2's loop body frame
      bind(n, s, items[k]);
      s.set("loop", loop_info(items, k));
      if (exec(n.body, s, out) == Flow::break_) break;
    }
    if (items.empty()) exec(n.else_body, scope, out);
    return Flow::normal;
  }

  void exec_set(const Node& n, Scope& scope) {
    Value v = eval(*n.expr, scope);
    if (n.attr.empty()) {
      scope.set(n.targets[0], std::move(v));
      return;
    }
    const Value* target = scope.find(n.targets[0]);
    if (!target || target->kind != K::ns)
      fail_at(n.where,
              fmt::format("cannot assign attribute on non-namespace object '{}'", n.targets[0]));
    target->dict->set(n.attr, std::move(v));
  }

  Value make_macro(const Node& n) {
    return Value::function([this, &n](Args& a) {
      Scope s{&root_, {}};
      for (size_t k = 0; k < n.targets.size(); ++k) {
        Value v = a.take(k, n.targets[k]);
        if (v.is_undefined() && n.defaults[k]) v = eval(*n.defaults[k], s);
        s.set(n.targets[k], std::move(v));
      }
      a.check_consumed("macro " + n.name);
      std::string text;
      exec(n.body, s, text);
      return Value::string(text);
    });
  }

  Args eval_args(const Expr& e, size_t first, Scope& scope) {
    Args a;
    for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k], scope));
    for (const auto& [key, x] : e.kwargs) a.kw.emplace_back(key, eval(*x, scope));
    return a;
  }

  Value call(const Expr& e, Scope& scope) {
    const Expr& callee = *e.args[0];
    if (callee.op == Expr::Op::attr) {
      const Value obj = eval(*callee.args[0], scope);
      const Value* member =
          (obj.kind == K::dict || obj.kind == K::ns) ? obj.dict->find(callee.name) : nullptr;
      if (!member || member->kind != K::function) {
        Args a = eval_args(e, 1, scope);
        return call_method(obj, callee.name, a, e.where);
      }
    }
    const Value f = eval(callee, scope);
    if (f.is_undefined()) undefined_error(f);
    if (f.kind != K::function) py_error(fmt::format("'{}' object is not callable", type_name(f)));
    Args a = eval_args(e, 1, scope);
    Value r = (*f.fn)(a);
    a.check_consumed("call");
    return r;
  }

  Value eval(const Expr& e, Scope& scope) {
    return checked(e.where, [&] { return eval_unchecked(e, scope); });
  }

  Value eval_unchecked(const Expr& e, Scope& scope) {
    using Op = Expr::Op;
    switch (e.op) {
      case Op::literal:
        return e.lit;
      case Op::name: {
        const Value* v = scope.find(e.name);
        return v ? *v : Value::undefined(fmt::format("'{}' is undefined", e.name));
      }
      case Op::list: {
        List items;
        for (const ExprPtr& x : e.args) items.push_back(eval(*x, scope));
        return e.name == "tuple" ? Value::make_tuple(std::move(items))
                                 : Value::make_list(std::move(items));
      }
      case Op::dict:
        return eval_dict(e, scope);
      case Op::attr:
        return get_attr(eval(*e.args[0], scope), e.name);
      case Op::item:
        return get_item(eval(*e.args[0], scope), eval(*e.args[1], scope));
      case Op::slice:
        return eval_slice(e, scope);
      case Op::call:
        return call(e, scope);
      case Op::filter: {
        Value v = eval(*e.args[0], scope);
        Args a = eval_args(e, 1, scope);
        return apply_filter(e.name, std::move(v), a, e.where);
      }
      case Op::test: {
        const Value v = eval(*e.args[0], scope);
        Args a = eval_args(e, 1, scope);
        return Value::boolean(apply_test(e.name, v, a, e.where));
      }
      default:
        return eval_operator(e, scope);
    }
  }

  Value eval_operator(const Expr& e, Scope& scope) {
    using Op = Expr::Op;
    switch (e.op) {
      case Op::not_:
        return Value::boolean(!truthy(eval(*e.args[0], scope)));
      case Op::neg:
      case Op::pos: {
        const Value v = eval(*e.args[0], scope);
        if (!v.is_number()) operand_error(e.op == Op::neg ? "unary -" : "unary +", v, v);
        if (e.op == Op::pos) return v.kind == K::real ? v : Value::integer(as_int(v));
        return v.kind == K::real ? Value::real(-v.d) : Value::integer(-as_int(v));
      }
      case Op::binary:
        return binary(e.name, eval(*e.args[0], scope), eval(*e.args[1], scope));
      case Op::compare: {
        Value left = eval(*e.args[0], scope);
        for (size_t k = 0; k < e.cmp.size(); ++k) {
          Value right = eval(*e.args[k + 1], scope);
          if (!compare(e.cmp[k], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Op::and_: {
        Value a = eval(*e.args[0], scope);
        return truthy(a) ? eval(*e.args[1], scope) : a;
      }
      case Op::or_: {
        Value a = eval(*e.args[0], scope);
        return truthy(a) ? a : eval(*e.args[1], scope);
      }
      case Op::cond:
        if (truthy(eval(*e.args[0], scope))) return eval(*e.args[1], scope);
        if (e.args[2]) return eval(*e.args[2], scope);
        return Value::undefined(
            fmt::format("the inline if-expression on line {} evaluated to false and no else "
                        "section was defined.",
                        e.where.line));
      default:
        py_error("unknown expression");
    }
  }

  Value eval_dict(const Expr& e, Scope& scope) {
    Value d = Value::make_dict();
    for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
      const Value key = eval(*e.args[k], scope);
      if (!key.is_string()) py_error("chat template dict keys must be strings");
      d.dict->set(key.s, eval(*e.args[k + 1], scope));
    }
    return d;
  }

  Value eval_slice(const Expr& e, Scope& scope) {
    const Value obj = eval(*e.args[0], scope);
    Value parts[3];
    const Value* bounds[3] = {nullptr, nullptr, nullptr};
    for (int k = 0; k < 3; ++k)
      if (e.args[size_t(k) + 1]) {
        parts[k] = eval(*e.args[size_t(k) + 1], scope);
        bounds[k] = &parts[k];
      }
    return slice(obj, bounds);
  }

  Scope& root_;
};

}  // namespace

}  // namespace chat_detail

ChatTemplate::ChatTemplate(std::string_view source) {
  auto p = std::make_shared<chat_detail::Program>();
  p->source = std::string(source);
  p->body = chat_detail::parse_template(p->source);
  program_ = std::move(p);
}

const std::string& ChatTemplate::source() const { return program_->source; }

std::string ChatTemplate::render(const io::Json& messages, bool add_generation_prompt,
                                 const io::Json& extra) const {
  using chat_detail::Value;
  REDCO_CHECK(extra.is_object() || extra.is_null(),
              "ChatTemplate::render: extra must be a JSON object, got {}",
              io::Json::kind_name(extra.kind()));
  chat_detail::Scope globals;
  chat_detail::add_globals(globals);
  chat_detail::Scope root{&globals, {}};
  root.set("messages", Value::from_json(messages));
  root.set("add_generation_prompt", Value::boolean(add_generation_prompt));
  root.set("tools", Value::none());  // transformers passes both, None when not given
  root.set("documents", Value::none());
  if (extra.is_object())
    for (const auto& [k, v] : extra.as_object()) root.set(k, Value::from_json(v));
  std::string out;
  chat_detail::Renderer(root).exec(program_->body, root, out);
  return out;
}

}  // namespace redco::data
