// redco_cli.hpp on CLI11: each call forwards to CLI::App with the validators
// of cli11_conventions.hpp.
#include "redco_cli.hpp"

#include <deque>
#include <limits>

#include "cli11_conventions.hpp"

namespace redco::cli {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

Check bounds(double lo, double hi, bool integer) {
  Check c;
  c.lo = lo, c.hi = hi, c.integer = integer;
  return c;
}
}  // namespace

Check at_least(int64_t lo) { return bounds(double(lo), kInf, true); }
Check between(int64_t lo, int64_t hi) { return bounds(double(lo), double(hi), true); }
Check positive() {
  Check c;
  c.kind = Check::Kind::positive;
  return c;
}
Check non_negative() { return bounds(0, kInf, false); }
Check in_range(double lo, double hi) { return bounds(lo, hi, false); }
Check at_least_or(int64_t lo, std::string word) {
  Check c = bounds(double(lo), kInf, true);
  c.names = {std::move(word)};
  return c;
}
Check one_of(std::vector<std::string> names) {
  Check c;
  c.kind = Check::Kind::one_of, c.names = std::move(names);
  return c;
}

Option* Option::check(const Check& c) {
  auto* o = static_cast<CLI::Option*>(impl_);
  switch (c.kind) {
    case Check::Kind::positive:
      o->check(cli11::positive());
      break;
    case Check::Kind::one_of:
      o->check(CLI::IsMember(c.names));
      break;
    case Check::Kind::bounds: {
      CLI::Validator v =
          c.integer ? cli11::detail::bounds(c.lo, c.hi, true) : cli11::in_range(c.lo, c.hi);
      if (c.names.empty()) {
        o->check(v);
      } else {  // the number, or the one word also allowed (at_least_or)
        const std::string word = c.names[0];
        o->check(CLI::Validator(
            [v, word](std::string& text) mutable { return text == word ? std::string() : v(text); },
            v.get_description() + " or " + word));
      }
      break;
    }
  }
  return this;
}
Option* Option::delimiter(char separator) {
  static_cast<CLI::Option*>(impl_)->delimiter(separator);
  return this;
}

struct App::Impl {
  CLI::App app;
  std::deque<Option> options;  // stable addresses for the pointers handed out
  Option* add(CLI::Option* o) {
    options.push_back(Option(o));
    return &options.back();
  }
};

App::App(const std::string& description) : impl_(new Impl{CLI::App{description}, {}}) {}
App::~App() = default;

#define REDCO_CLI_OPTION(T)                                                             \
  Option* App::add_option(const std::string& name, T& value, const std::string& help) { \
    return impl_->add(impl_->app.add_option(name, value, help)->capture_default_str()); \
  }
REDCO_CLI_OPTION(int)
REDCO_CLI_OPTION(int64_t)
REDCO_CLI_OPTION(uint64_t)
REDCO_CLI_OPTION(float)
REDCO_CLI_OPTION(double)
REDCO_CLI_OPTION(std::string)
REDCO_CLI_OPTION(std::vector<std::string>)
REDCO_CLI_OPTION(std::vector<int64_t>)
REDCO_CLI_OPTION(std::vector<int>)
#undef REDCO_CLI_OPTION
#define REDCO_CLI_OPTIONAL(T)                                               \
  Option* App::add_option(const std::string& name, std::optional<T>& value, \
                          const std::string& help) {                        \
    return impl_->add(impl_->app.add_option(name, value, help));            \
  }
REDCO_CLI_OPTIONAL(int64_t)
REDCO_CLI_OPTIONAL(float)
REDCO_CLI_OPTIONAL(double)
#undef REDCO_CLI_OPTIONAL

Option* App::add_flag(const std::string& name, bool& value, const std::string& help) {
  return impl_->add(impl_->app.add_flag(name, value, help));
}

int App::parse(int argc, const char* const* argv) { return cli11::parse(impl_->app, argc, argv); }

}  // namespace redco::cli
