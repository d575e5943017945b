#pragma once
// The inside of data::ChatTemplate: Jinja values with Python's semantics, the
// parsed template (expressions and statements), and the helpers the parser
// (chat_template_parse.cpp), the evaluator (chat_template.cpp) and the
// filters (chat_template_filters.cpp) share. Not installed API.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/io/json.hpp"

namespace redco::data::chat_detail {

struct Value;
using List = std::vector<Value>;
struct Dict;
struct Args;
using Function = std::function<Value(Args&)>;

// A Python value as a template sees it. Lists and dicts are shared, as Python
// references are; the immutable sandbox lets a template change only a
// namespace, so sharing is never observable otherwise.
struct Value {
  enum class Kind : uint8_t {
    undefined,
    none,
    boolean,
    integer,
    real,
    string,
    list,
    dict,
    ns,
    function
  };
  Kind kind = Kind::undefined;
  bool b = false;
  bool tuple = false;      // a list that Python holds as a tuple: prints as (a, b)
  bool generator = false;  // what map / select return: iterable once, no len, no JSON
  int64_t i = 0;
  double d = 0;
  std::string s;  // a string; for undefined, the name that was missing (for the error)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // dict and namespace
  std::shared_ptr<const Function> fn;

  static Value undefined(std::string hint = {}) {
    Value v;
    v.s = std::move(hint);
    return v;
  }
  static Value none() { return make(Kind::none); }
  static Value boolean(bool x) {
    Value v = make(Kind::boolean);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = make(Kind::integer);
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v = make(Kind::real);
    v.d = x;
    return v;
  }
  static Value string(std::string x) {
    Value v = make(Kind::string);
    v.s = std::move(x);
    return v;
  }
  static Value make_list(List items = {});
  static Value make_tuple(List items) {
    Value v = make_list(std::move(items));
    v.tuple = true;
    return v;
  }
  static Value make_generator(List items) {
    Value v = make_list(std::move(items));
    v.generator = true;
    return v;
  }
  static Value make_dict(Kind kind = Kind::dict);
  static Value function(Function f) {
    Value v = make(Kind::function);
    v.fn = std::make_shared<const Function>(std::move(f));
    return v;
  }
  static Value from_json(const io::Json& j);

  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_string() const { return kind == Kind::string; }
  bool is_number() const {
    return kind == Kind::integer || kind == Kind::real || kind == Kind::boolean;
  }

 private:
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

// A dict in insertion order (Python's); keys are strings, as JSON's are.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // The argument at `index` or named `name`, else `fallback`; consumed, so
  // that check_consumed() can refuse unknown keywords.
  Value take(size_t index, std::string_view name, Value fallback = Value::undefined());
  void check_consumed(std::string_view what) const;
  size_t taken_pos = 0;
};

// Python semantics the evaluator and the filters share.
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
std::string to_str(const Value& v);   // str(): what {{ }} prints ("" for undefined)
std::string to_repr(const Value& v);  // repr(): how a list prints its items
std::string type_name(const Value& v);
std::string float_repr(double d);
// json.dumps(v, ensure_ascii=..., indent=..., sort_keys=...); indent < 0: none.
std::string to_json(const Value& v, bool ensure_ascii, int indent, bool sort_keys);
std::u32string code_points(std::string_view s);
std::string utf8(const std::u32string& s);
bool py_isspace(char32_t c);
// str.strip / lstrip / rstrip: `chars` undefined or none strips whitespace.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);
std::vector<Value> iterate(const Value& v);  // for x in v (raises where Python would)
int64_t py_len(const Value& v);

// A Python exception (TypeError, UndefinedError, ...) without a location yet:
// the evaluator rethrows it as redco::Error naming the expression's line.
struct PyError {
  std::string msg;
};
[[noreturn]] inline void py_error(std::string msg) { throw PyError{std::move(msg)}; }

// String helpers with CPython's and jinja2's rules (chat_template_methods.cpp).
std::string upper(const std::string& s);
std::string lower(const std::string& s);
std::string py_capitalize(const std::string& s);
std::string jinja_title(const std::string& s);  // the `title` filter
std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count);
std::string need_str(const Value& v, std::string_view what);
int64_t need_int(const Value& v, std::string_view what);
// getitem along "a.b.0", as selectattr and map(attribute=) look attributes up.
Value attr_path(const Value& v, const Value& attr);

// The location a runtime error names.
struct Where {
  int line = 0, col = 0;
};
[[noreturn]] void fail_at(Where w, const std::string& msg);

// Expressions.
struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;
struct Expr {
  enum class Op : uint8_t {
    literal,  // lit
    name,     // name
    list,     // args (name "tuple": a parenthesised tuple)
    dict,     // args: key, value, key, value, ...
    attr,     // args[0].name
    item,     // args[0][args[1]]
    slice,    // args[0][args[1]:args[2]:args[3]] (null: omitted)
    call,     // args[0](args[1..], kwargs)
    filter,   // args[0] | name(args[1..], kwargs)
    test,     // args[0] is name(args[1..])
    not_,     // not args[0]
    neg,      // -args[0]
    pos,      // +args[0]
    binary,   // args[0] name args[1]: + - * / // % ** ~
    compare,  // args[0] cmp[0] args[1] cmp[1] args[2] ...
    and_,     // args[0] and args[1]
    or_,      // args[0] or args[1]
    cond,     // args[1] if args[0] else args[2] (null: undefined)
  };
  Op op = Op::literal;
  Where where;
  Value lit;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> cmp;  // ==, !=, <, <=, >, >=, in, notin
};

// Statements.
struct Node;
using Body = std::vector<Node>;
struct Node {
  enum class Kind : uint8_t {
    text,       // text
    output,     // {{ expr }}
    if_,        // branches (cond, body) then else_body
    for_,       // for targets in expr [if filter]: body [else else_body]
    set,        // set targets[0] = expr; with attr: set targets[0].attr = expr
    set_block,  // set targets[0] %}body{% endset
    macro,      // macro name(targets with defaults) body
    break_,
    continue_,
    block,  // a body rendered in place ({% generation %})
  };
  Kind kind = Kind::text;
  Where where;
  std::string text, name, attr;
  ExprPtr expr, filter;
  std::vector<std::string> targets;
  std::vector<ExprPtr> defaults;  // macro parameters' defaults (null: none)
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
};

struct Program {
  std::string source;
  Body body;
};

// Tokens, with the text between tags already whitespace-controlled
// (chat_template_lex.cpp).
struct Token {
  enum class Type : uint8_t {
    text,
    block_begin,
    block_end,
    var_begin,
    var_end,
    name,
    string,
    integer,
    real,
    op,
    eof
  };
  Type type = Type::eof;
  std::string value;
  Where where;
};
using T = Token::Type;
std::vector<Token> lex_template(const std::string& source);

Body parse_template(const std::string& source);

// Filters and tests (chat_template_filters.cpp). `call` runs a macro or a
// global function (map and select take filter and test names only).
Value apply_filter(const std::string& name, Value v, Args& args, Where w);
bool apply_test(const std::string& name, const Value& v, Args& args, Where w);
bool has_filter(std::string_view name);
bool has_test(std::string_view name);
// x.name(args) on a string, dict or list.
Value call_method(const Value& obj, const std::string& name, Args& args, Where w);
// obj[key] and obj.key as jinja's environment resolves them (undefined when missing).
Value get_item(const Value& obj, const Value& key);
Value get_attr(const Value& obj, const std::string& name);

}  // namespace redco::data::chat_detail
