#pragma once
// redco::Error: every failure a user can cause ends in one of these, with a
// message that names the thing (tensor, op, file, shape) and what to do.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace redco {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace redco

// REDCO_CHECK(cond, "fmt {}", args...): throws redco::Error with the message.
#define REDCO_CHECK(cond, ...)               \
  do {                                       \
    if (!(cond)) ::redco::fail(__VA_ARGS__); \
  } while (0)
