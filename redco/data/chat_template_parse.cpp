// The chat template's parser: jinja2 3.1's grammar (its precedence, its tests
// and filters binding tighter than arithmetic) for the subset chat templates
// use. Everything else is refused here, at construction, naming the line and
// column.
#include <algorithm>
#include <cstdlib>
#include <set>

#include "redco/data/chat_template_ast.hpp"

namespace redco::data::chat_detail {

namespace {

using T = Token::Type;

ExprPtr make(Expr::Op op, Where w, std::vector<ExprPtr> args = {}) {
  auto e = std::make_shared<Expr>();
  e->op = op;
  e->where = w;
  e->args = std::move(args);
  return e;
}

ExprPtr literal(Value v, Where w) {
  auto e = std::make_shared<Expr>();
  e->where = w;
  e->lit = std::move(v);
  return e;
}

const std::set<std::string, std::less<>> kUnsupportedTags = {
    "include", "import", "from", "extends", "block",      "call",  "filter",
    "with",    "raw",    "do",   "trans",   "autoescape", "endraw"};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Body parse() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  bool is_op(std::string_view op) const { return cur().type == T::op && cur().value == op; }
  bool is_name(std::string_view n) const { return cur().type == T::name && cur().value == n; }
  bool accept_op(std::string_view op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool accept_name(std::string_view n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  [[noreturn]] void unexpected(std::string_view wanted) const {
    const Token& t = cur();
    std::string got = t.type == T::eof         ? "end of template"
                      : t.type == T::block_end ? "'%}'"
                      : t.type == T::var_end   ? "'}}'"
                                               : "'" + t.value + "'";
    fail_at(t.where, fmt::format("expected {}, got {}", wanted, got));
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op)) unexpected(fmt::format("'{}'", op));
  }
  std::string expect_name() {
    if (cur().type != T::name) unexpected("a name");
    return toks_[i_++].value;
  }
  void expect_block_end() {
    if (cur().type != T::block_end) unexpected("'%}'");
    ++i_;
  }

  // Statements up to a block tag named in `ends` (consumed; its name goes to
  // `end`) or the end of the template (only where `ends` is empty).
  Body parse_body(const std::vector<std::string>& ends, std::string& end) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == T::eof) {
        if (ends.empty()) return body;
        fail_at(open_.back().second, fmt::format("unterminated '{}' block: missing '{{% {} %}}'",
                                                 open_.back().first, ends.back()));
      }
      if (t.type == T::text) {
        body.push_back(text_node(t));
        ++i_;
      } else if (t.type == T::var_begin) {
        body.push_back(output());
      } else if (t.type == T::block_begin) {
        const Token& kw = peek();
        if (kw.type == T::name && std::find(ends.begin(), ends.end(), kw.value) != ends.end()) {
          end = kw.value;
          i_ += 2;
          return body;
        }
        body.push_back(statement());
      } else {
        unexpected("text or a tag");
      }
    }
  }

  static Node text_node(const Token& t) {
    Node n;
    n.kind = Node::Kind::text;
    n.where = t.where;
    n.text = t.value;
    return n;
  }

  Node output() {
    Node n;
    n.kind = Node::Kind::output;
    n.where = cur().where;
    ++i_;
    n.expr = expression();
    if (cur().type != T::var_end) unexpected("'}}'");
    ++i_;
    return n;
  }

  Node statement() {
    ++i_;  // {%
    const Token kw = cur();
    if (kw.type != T::name) unexpected("a tag name");
    ++i_;
    const std::string& k = kw.value;
    if (k == "if") return if_stmt(kw.where);
    if (k == "for") return for_stmt(kw.where);
    if (k == "set") return set_stmt(kw.where);
    if (k == "macro") return macro_stmt(kw.where);
    if (k == "generation") return block_stmt(kw.where, "endgeneration");
    if (k == "break" || k == "continue") {
      if (loops_ == 0) fail_at(kw.where, fmt::format("'{}' outside a for loop", k));
      expect_block_end();
      Node n;
      n.kind = k == "break" ? Node::Kind::break_ : Node::Kind::continue_;
      n.where = kw.where;
      return n;
    }
    if (kUnsupportedTags.contains(k))
      fail_at(kw.where, fmt::format("unsupported tag '{}' (chat templates support if, for, set, "
                                    "macro, break, continue)",
                                    k));
    if (!open_.empty() && (k.starts_with("end") || k == "elif" || k == "else"))
      fail_at(kw.where, fmt::format("unexpected '{}': the '{}' block opened at line {}, column {} "
                                    "is still open (missing '{{% end{} %}}')",
                                    k, open_.back().first, open_.back().second.line,
                                    open_.back().second.col, open_.back().first));
    fail_at(kw.where, fmt::format("unknown or misplaced tag '{}'", k));
  }

  Node if_stmt(Where w) {
    Node n;
    n.kind = Node::Kind::if_;
    n.where = w;
    open_.emplace_back("if", w);
    std::string end = "elif";
    while (end == "elif") {
      ExprPtr cond = expression();
      expect_block_end();
      Body body = parse_body({"elif", "else", "endif"}, end);
      n.branches.emplace_back(std::move(cond), std::move(body));
    }
    if (end == "else") {
      expect_block_end();
      n.else_body = parse_body({"endif"}, end);
    }
    expect_block_end();
    open_.pop_back();
    return n;
  }

  Node for_stmt(Where w) {
    Node n;
    n.kind = Node::Kind::for_;
    n.where = w;
    const bool paren = accept_op("(");
    n.targets.push_back(expect_name());
    while (accept_op(",")) n.targets.push_back(expect_name());
    if (paren) expect_op(")");
    if (!accept_name("in")) unexpected("'in'");
    n.expr = or_expr();  // jinja2: no conditional expression here, so `if` filters
    if (accept_name("if")) n.filter = expression();
    if (is_name("recursive")) fail_at(cur().where, "unsupported: recursive for loops");
    expect_block_end();
    open_.emplace_back("for", w);
    ++loops_;
    std::string end;
    n.body = parse_body({"else", "endfor"}, end);
    --loops_;
    if (end == "else") {
      expect_block_end();
      n.else_body = parse_body({"endfor"}, end);
    }
    expect_block_end();
    open_.pop_back();
    return n;
  }

  Node set_stmt(Where w) {
    Node n;
    n.kind = Node::Kind::set;
    n.where = w;
    n.targets.push_back(expect_name());
    if (accept_op(".")) n.attr = expect_name();
    if (is_op(",")) fail_at(cur().where, "unsupported: tuple assignment in set");
    if (cur().type == T::block_end && n.attr.empty()) {
      ++i_;
      n.kind = Node::Kind::set_block;
      open_.emplace_back("set", w);
      std::string end;
      n.body = parse_body({"endset"}, end);
      expect_block_end();
      open_.pop_back();
      return n;
    }
    expect_op("=");
    n.expr = expression();
    expect_block_end();
    return n;
  }

  Node macro_stmt(Where w) {
    Node n;
    n.kind = Node::Kind::macro;
    n.where = w;
    n.name = expect_name();
    expect_op("(");
    while (!accept_op(")")) {
      if (!n.targets.empty()) expect_op(",");
      n.targets.push_back(expect_name());
      n.defaults.push_back(accept_op("=") ? expression() : nullptr);
    }
    expect_block_end();
    open_.emplace_back("macro", w);
    const int loops = std::exchange(loops_, 0);
    std::string end;
    n.body = parse_body({"endmacro"}, end);
    loops_ = loops;
    if (cur().type == T::name) ++i_;  // {% endmacro name %}
    expect_block_end();
    open_.pop_back();
    return n;
  }

  Node block_stmt(Where w, const std::string& end_tag) {
    Node n;
    n.kind = Node::Kind::block;
    n.where = w;
    expect_block_end();
    open_.emplace_back(end_tag.substr(3), w);
    std::string end;
    n.body = parse_body({end_tag}, end);
    expect_block_end();
    open_.pop_back();
    return n;
  }

  // Expressions, by jinja2's precedence (Parser.parse_condexpr downwards).
  ExprPtr expression() {
    ExprPtr e = or_expr();
    while (is_name("if")) {
      const Where w = cur().where;
      ++i_;
      ExprPtr cond = or_expr();
      ExprPtr other = accept_name("else") ? expression() : nullptr;
      e = make(Expr::Op::cond, w, {cond, e, other});
    }
    return e;
  }

  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (is_name("or")) {
      const Where w = toks_[i_++].where;
      e = make(Expr::Op::or_, w, {e, and_expr()});
    }
    return e;
  }

  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (is_name("and")) {
      const Where w = toks_[i_++].where;
      e = make(Expr::Op::and_, w, {e, not_expr()});
    }
    return e;
  }

  ExprPtr not_expr() {
    if (is_name("not")) {
      const Where w = toks_[i_++].where;
      return make(Expr::Op::not_, w, {not_expr()});
    }
    return compare();
  }

  ExprPtr compare() {
    const Where w = cur().where;
    ExprPtr first = math1();
    auto e = std::make_shared<Expr>();
    e->op = Expr::Op::compare;
    e->where = w;
    e->args.push_back(first);
    static const std::set<std::string, std::less<>> kCmp = {"==", "!=", "<", "<=", ">", ">="};
    while (true) {
      if (cur().type == T::op && kCmp.contains(cur().value)) {
        e->cmp.push_back(toks_[i_++].value);
      } else if (is_name("in")) {
        ++i_;
        e->cmp.push_back("in");
      } else if (is_name("not") && peek().type == T::name && peek().value == "in") {
        i_ += 2;
        e->cmp.push_back("notin");
      } else {
        break;
      }
      e->args.push_back(math1());
    }
    return e->cmp.empty() ? first : ExprPtr(e);
  }

  ExprPtr binary_chain(const std::vector<std::string_view>& ops, ExprPtr (Parser::*next)()) {
    ExprPtr e = (this->*next)();
    while (cur().type == T::op && std::find(ops.begin(), ops.end(), cur().value) != ops.end()) {
      auto b = std::make_shared<Expr>();
      b->op = Expr::Op::binary;
      b->where = cur().where;
      b->name = toks_[i_++].value;
      b->args = {e, (this->*next)()};
      e = b;
    }
    return e;
  }
  ExprPtr math1() { return binary_chain({"+", "-"}, &Parser::concat); }
  ExprPtr concat() { return binary_chain({"~"}, &Parser::math2); }
  ExprPtr math2() { return binary_chain({"*", "/", "//", "%"}, &Parser::pow_expr); }
  ExprPtr pow_expr() { return binary_chain({"**"}, &Parser::unary_filtered); }
  ExprPtr unary_filtered() { return unary(true); }

  ExprPtr unary(bool with_filter) {
    const Where w = cur().where;
    ExprPtr e;
    if (accept_op("-")) {
      e = make(Expr::Op::neg, w, {unary(false)});
    } else if (accept_op("+")) {
      e = make(Expr::Op::pos, w, {unary(false)});
    } else {
      e = primary();
    }
    e = postfix(e);
    return with_filter ? filter_expr(e) : e;
  }

  ExprPtr primary() {
    const Token t = cur();
    switch (t.type) {
      case T::name: {
        ++i_;
        if (t.value == "true" || t.value == "True") return literal(Value::boolean(true), t.where);
        if (t.value == "false" || t.value == "False")
          return literal(Value::boolean(false), t.where);
        if (t.value == "none" || t.value == "None") return literal(Value::none(), t.where);
        auto e = make(Expr::Op::name, t.where);
        std::const_pointer_cast<Expr>(e)->name = t.value;
        return e;
      }
      case T::string: {
        std::string s;
        while (cur().type == T::string) s += toks_[i_++].value;  // adjacent literals join
        return literal(Value::string(s), t.where);
      }
      case T::integer:
        ++i_;
        return literal(Value::integer(std::strtoll(t.value.c_str(), nullptr, 10)), t.where);
      case T::real:
        ++i_;
        return literal(Value::real(std::strtod(t.value.c_str(), nullptr)), t.where);
      default:
        break;
    }
    if (accept_op("(")) return parenthesised(t.where);
    if (accept_op("[")) return sequence(t.where, "]", Expr::Op::list);
    if (accept_op("{")) return sequence(t.where, "}", Expr::Op::dict);
    unexpected("an expression");
  }

  // (expr) or a tuple, which becomes a list (startswith(('a', 'b'))).
  ExprPtr parenthesised(Where w) {
    std::vector<ExprPtr> items;
    if (!is_op(")")) {
      items.push_back(expression());
      if (accept_op(")")) return items[0];
    }
    while (accept_op(",")) {
      if (is_op(")")) break;
      items.push_back(expression());
    }
    expect_op(")");
    auto e = make(Expr::Op::list, w, std::move(items));
    std::const_pointer_cast<Expr>(e)->name = "tuple";
    return e;
  }

  ExprPtr sequence(Where w, std::string_view close, Expr::Op op) {
    std::vector<ExprPtr> items;
    while (!accept_op(close)) {
      if (!items.empty()) {
        expect_op(",");
        if (accept_op(close)) break;
      }
      items.push_back(expression());
      if (op == Expr::Op::dict) {
        expect_op(":");
        items.push_back(expression());
      }
    }
    return make(op, w, std::move(items));
  }

  ExprPtr postfix(ExprPtr e) {
    while (true) {
      const Where w = cur().where;
      if (accept_op(".")) {
        if (cur().type == T::integer) {
          e = make(Expr::Op::item, w,
                   {e, literal(Value::integer(std::stoll(toks_[i_++].value)), w)});
        } else {
          auto a = make(Expr::Op::attr, w, {e});
          std::const_pointer_cast<Expr>(a)->name = expect_name();
          e = a;
        }
      } else if (accept_op("[")) {
        e = subscript(e, w);
      } else if (is_op("(")) {
        e = call(e, w);
      } else {
        return e;
      }
    }
  }

  ExprPtr subscript(ExprPtr obj, Where w) {
    ExprPtr parts[3];
    int n = 0;
    bool slice = false;
    while (true) {
      if (!is_op(":") && !is_op("]")) parts[n] = expression();
      if (accept_op("]")) break;
      expect_op(":");
      slice = true;
      if (++n > 2) unexpected("']'");
    }
    if (!slice) return make(Expr::Op::item, w, {obj, parts[0]});
    return make(Expr::Op::slice, w, {obj, parts[0], parts[1], parts[2]});
  }

  // (a, b, key=c) into e's args after its first and its kwargs.
  void call_args(Expr& e) {
    expect_op("(");
    for (bool first = true; !accept_op(")"); first = false) {
      if (!first) {
        expect_op(",");
        if (accept_op(")")) break;
      }
      if (cur().type == T::name && peek().type == T::op && peek().value == "=") {
        std::string key = toks_[i_].value;
        i_ += 2;
        e.kwargs.emplace_back(std::move(key), expression());
      } else {
        if (!e.kwargs.empty()) unexpected("a keyword argument after keyword arguments");
        e.args.push_back(expression());
      }
    }
  }

  ExprPtr call(ExprPtr callee, Where w) {
    auto e = std::make_shared<Expr>();
    e->op = Expr::Op::call;
    e->where = w;
    e->args.push_back(callee);
    call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && peek().type == T::name) {
      i_ += 1;
      name.append(".").append(expect_name());
    }
    return name;
  }

  ExprPtr filter_expr(ExprPtr e) {
    while (true) {
      const Where w = cur().where;
      if (accept_op("|")) {
        auto f = std::make_shared<Expr>();
        f->op = Expr::Op::filter;
        f->where = w;
        f->name = dotted_name();
        if (!has_filter(f->name)) fail_at(w, fmt::format("unsupported filter '{}'", f->name));
        f->args.push_back(e);
        if (is_op("(")) call_args(*f);
        e = f;
      } else if (is_name("is")) {
        ++i_;
        e = test(e, w);
      } else if (is_op("(")) {
        e = call(e, w);
      } else {
        return e;
      }
    }
  }

  ExprPtr test(ExprPtr e, Where w) {
    const bool negated = accept_name("not");
    auto t = std::make_shared<Expr>();
    t->op = Expr::Op::test;
    t->where = w;
    t->name = dotted_name();
    if (!has_test(t->name)) fail_at(w, fmt::format("unsupported test '{}'", t->name));
    t->args.push_back(e);
    const T ty = cur().type;
    if (is_op("(")) {
      call_args(*t);
    } else if ((ty == T::name || ty == T::string || ty == T::integer || ty == T::real ||
                is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) unexpected("a test argument");
      t->args.push_back(postfix(primary()));
    }
    return negated ? make(Expr::Op::not_, w, {t}) : ExprPtr(t);
  }

  std::vector<Token> toks_;
  size_t i_ = 0;
  int loops_ = 0;
  std::vector<std::pair<std::string, Where>> open_;  // blocks being parsed, for errors
};

}  // namespace

Body parse_template(const std::string& source) { return Parser(lex_template(source)).parse(); }

}  // namespace redco::data::chat_detail
