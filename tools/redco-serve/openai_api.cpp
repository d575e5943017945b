// OpenAI request parsing and response bodies (openai_api.hpp).
#include "openai_api.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

namespace redco::serve {
namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, "invalid_request_error", param, message);
}

// The keys each endpoint takes. Keys OpenAI defines that redco-serve cannot
// honour are accepted only at their "off" value (checked below), so a client
// never gets silently different behaviour; any other key is refused by name.
const std::set<std::string, std::less<>> kCommon = {
    "model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed",
    "presence_penalty", "frequency_penalty", "user", "logprobs", "logit_bias",
    // extensions vLLM and llama.cpp's server take too
    "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos"};
const std::set<std::string, std::less<>> kCompletionOnly = {"prompt", "echo", "best_of", "suffix"};
const std::set<std::string, std::less<>> kChatOnly = {
    "messages", "max_completion_tokens", "top_logprobs",       "response_format",
    "tools",    "tool_choice",           "parallel_tool_calls"};

double number(const io::Json& body, std::string_view key, double lo, double hi, double fallback) {
  if (!body.contains(key) || body.at(key).is_null()) return fallback;
  const io::Json& v = body.at(key);
  if (!v.is_number()) bad(std::string(key), fmt::format("'{}' must be a number", key));
  const double x = v.as_double();
  if (!(x >= lo && x <= hi))
    bad(std::string(key), fmt::format("'{}' is {} but must be in [{}, {}]", key, x, lo, hi));
  return x;
}

std::optional<int64_t> integer(const io::Json& body, std::string_view key, int64_t lo, int64_t hi) {
  if (!body.contains(key) || body.at(key).is_null()) return std::nullopt;
  const io::Json& v = body.at(key);
  if (!v.is_int()) bad(std::string(key), fmt::format("'{}' must be an integer", key));
  int64_t x = 0;
  try {
    x = v.as_int();
  } catch (const std::exception&) {  // beyond int64
    bad(std::string(key), fmt::format("'{}' must be in [{}, {}]", key, lo, hi));
  }
  if (x < lo || x > hi)
    bad(std::string(key), fmt::format("'{}' is {} but must be in [{}, {}]", key, x, lo, hi));
  return x;
}

bool flag(const io::Json& body, std::string_view key) {
  if (!body.contains(key) || body.at(key).is_null()) return false;
  if (!body.at(key).is_bool())
    bad(std::string(key), fmt::format("'{}' must be true or false", key));
  return body.at(key).as_bool();
}

// A key accepted only at its "off" value.
void only_off(const io::Json& body, std::string_view key, const io::Json& off,
              const std::string& why) {
  if (!body.contains(key) || body.at(key).is_null() || body.at(key) == off) return;
  bad(std::string(key), fmt::format("'{}' is not supported by redco-serve: {}", key, why));
}

std::vector<std::string> stops(const io::Json& body) {
  if (!body.contains("stop") || body.at("stop").is_null()) return {};
  const io::Json& s = body.at("stop");
  std::vector<std::string> out;
  if (s.is_string()) {
    out.push_back(s.as_string());
  } else if (s.is_array()) {
    for (size_t i = 0; i < s.size(); ++i) {
      if (!s.at(i).is_string()) bad("stop", "'stop' must be a string or a list of strings");
      out.push_back(s.at(i).as_string());
    }
  } else {
    bad("stop", "'stop' must be a string or a list of strings");
  }
  if (out.size() > 16) bad("stop", "'stop' takes at most 16 strings");
  for (const std::string& x : out)
    if (x.empty()) bad("stop", "'stop' holds an empty string");
  return out;
}

std::vector<int64_t> ids_of(const io::Json& a, int64_t vocab) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a.at(i).is_int()) bad("prompt", "'prompt' must be a string or a list of token ids");
    const int64_t t = a.at(i).as_int();
    if (t < 0 || (vocab > 0 && t >= vocab))
      bad("prompt", fmt::format("prompt token {} is not in the vocabulary [0, {})", t, vocab));
    ids.push_back(t);
  }
  return ids;
}

// "prompt": a string, a list of token ids, or a list holding one of those.
void read_prompt(const io::Json& body, int64_t vocab, Request& r) {
  if (!body.contains("prompt")) bad("prompt", "'prompt' is required");
  const io::Json* p = &body.at("prompt");
  if (p->is_array() && p->size() == 1 && (p->at(0).is_string() || p->at(0).is_array()))
    p = &p->at(0);
  else if (p->is_array() && p->size() > 0 && !p->at(0).is_int())
    bad("prompt", "one prompt per request: send several requests (they are batched together)");
  if (p->is_string())
    r.prompt_text = p->as_string();
  else if (p->is_array())
    r.prompt_ids = ids_of(*p, vocab);
  else
    bad("prompt", "'prompt' must be a string or a list of token ids");
  if ((r.prompt_text && r.prompt_text->empty()) || (!r.prompt_text && r.prompt_ids.empty()))
    bad("prompt", "'prompt' is empty");
}

// A message's content as text: a string, or a list of {"type": "text"} parts.
io::Json content_text(const io::Json& m, size_t i) {
  const std::string param = fmt::format("messages[{}].content", i);
  if (!m.contains("content") || m.at("content").is_null()) return io::Json("");
  const io::Json& c = m.at("content");
  if (c.is_string()) return c;
  if (!c.is_array()) bad(param, "a message's content must be a string or a list of text parts");
  std::string text;
  for (size_t j = 0; j < c.size(); ++j) {
    const io::Json& part = c.at(j);
    if (!part.is_object() || !part.contains("type") || !part.at("type").is_string() ||
        part.at("type").as_string() != "text" || !part.contains("text") ||
        !part.at("text").is_string())
      bad(param, "only text parts ({\"type\": \"text\", \"text\": ...}) are supported");
    text += part.at("text").as_string();
  }
  return io::Json(text);
}

void read_messages(const io::Json& body, Request& r) {
  if (!body.contains("messages") || !body.at("messages").is_array() ||
      body.at("messages").size() == 0)
    bad("messages", "'messages' must be a non-empty list of {\"role\", \"content\"}");
  const io::Json& ms = body.at("messages");
  r.messages = io::Json::array();
  for (size_t i = 0; i < ms.size(); ++i) {
    const io::Json& m = ms.at(i);
    if (!m.is_object() || !m.contains("role") || !m.at("role").is_string())
      bad(fmt::format("messages[{}]", i), "each message needs a string 'role'");
    const std::string& role = m.at("role").as_string();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer")
      bad(fmt::format("messages[{}].role", i),
          fmt::format("role '{}' is not one of system, developer, user, assistant", role));
    io::Json out = io::Json::object();
    out["role"] = io::Json(role == "developer" ? "system" : role);
    out["content"] = content_text(m, i);
    r.messages.push_back(std::move(out));
  }
}

void check_keys(const io::Json& body, Endpoint e) {
  const auto& own = e == Endpoint::chat ? kChatOnly : kCompletionOnly;
  for (const auto& [key, value] : body.as_object())
    if (!kCommon.contains(key) && !own.contains(key))
      bad(key, fmt::format("unknown field '{}' for /v1/{}", key,
                           e == Endpoint::chat ? "chat/completions" : "completions"));
}

void read_sampling(const io::Json& body, const Limits& limits, generation::GenerationConfig& c) {
  c = limits.defaults;
  c.num_beams = 1, c.num_return_sequences = 1;
  const double temperature = number(body, "temperature", 0, 2, 1);
  c.do_sample = temperature > 0;
  c.temperature = c.do_sample ? float(temperature) : 1.f;
  c.top_p = float(number(body, "top_p", 1e-6, 1, 1));
  c.top_k = integer(body, "top_k", -1, 1 << 30).value_or(0);
  if (c.top_k < 0) c.top_k = 0;  // vLLM's -1: off
  c.min_p = float(number(body, "min_p", 0, 1, 0));
  c.presence_penalty = float(number(body, "presence_penalty", -2, 2, 0));
  c.frequency_penalty = float(number(body, "frequency_penalty", -2, 2, 0));
  c.repetition_penalty = float(number(body, "repetition_penalty", 1e-3, 100, 1));
  c.min_new_tokens = integer(body, "min_tokens", 0, limits.context).value_or(0);
  if (flag(body, "ignore_eos")) c.eos_token_ids.clear();
  c.stop_strings = stops(body);
  if (const auto seed = integer(body, "seed", INT64_MIN, INT64_MAX))
    c.seed = uint64_t(*seed);
  else  // OpenAI's default: a fresh draw each request
    c.seed = std::random_device{}() * 0x9E3779B97F4A7C15ull + std::random_device{}();
}

}  // namespace

io::Json error_body(const std::string& message, const std::string& type, const std::string& param) {
  io::Json e = io::Json::object();
  e["message"] = io::Json(message);
  e["type"] = io::Json(type);
  e["param"] = param.empty() ? io::Json() : io::Json(param);
  e["code"] = io::Json();
  io::Json out = io::Json::object();
  out["error"] = std::move(e);
  return out;
}

Request parse_request(const std::string& text, Endpoint e, const Limits& limits) {
  io::Json body;
  try {
    body = io::Json::parse(text, "the request body");
  } catch (const std::exception& x) {
    bad("", fmt::format("the body is not JSON: {}", x.what()));
  }
  if (!body.is_object()) bad("", "the body must be a JSON object");
  check_keys(body, e);
  if (body.contains("model") && !body.at("model").is_null()) {
    if (!body.at("model").is_string()) bad("model", "'model' must be a string");
    if (body.at("model").as_string() != limits.model_name)
      throw ApiError(404, "not_found_error", "model",
                     fmt::format("model '{}' is not served here; GET /v1/models lists '{}'",
                                 body.at("model").as_string(), limits.model_name));
  }
  Request r;
  r.endpoint = e;
  if (e == Endpoint::chat)
    read_messages(body, r);
  else
    read_prompt(body, limits.vocab_size, r);
  if (integer(body, "n", 1, 128).value_or(1) != 1)
    bad("n", "'n' must be 1: send n requests instead (they run in one batch)");
  only_off(body, "best_of", io::Json(int64_t(1)), "one sequence per request");
  only_off(body, "echo", io::Json(false), "the prompt is not repeated");
  only_off(body, "suffix", io::Json(""), "no insertion");
  only_off(body, "logprobs", io::Json(e == Endpoint::chat ? io::Json(false) : io::Json(int64_t(0))),
           "no log-probabilities");
  only_off(body, "top_logprobs", io::Json(int64_t(0)), "no log-probabilities");
  only_off(body, "logit_bias", io::Json::object(), "no logit bias");
  only_off(body, "tools", io::Json::array(), "no tool calls");
  only_off(body, "tool_choice", io::Json("none"), "no tool calls");
  if (body.contains("response_format") && !body.at("response_format").is_null() &&
      !(body.at("response_format").is_object() && body.at("response_format").contains("type") &&
        body.at("response_format").at("type") == io::Json("text")))
    bad("response_format", "only {\"type\": \"text\"} is supported");
  read_sampling(body, limits, r.config);
  r.stream = flag(body, "stream");
  if (body.contains("stream_options") && body.at("stream_options").is_object())
    r.include_usage = flag(body.at("stream_options"), "include_usage");
  const char* max_key = e == Endpoint::chat && body.contains("max_completion_tokens")
                            ? "max_completion_tokens"
                            : "max_tokens";
  if (const auto m = integer(body, max_key, 1, limits.context)) {
    r.config.max_new_tokens = *m;
    r.max_tokens_given = true;
  }
  return r;
}

void fit_to_context(Request& r, int64_t prompt_tokens, const Limits& limits) {
  const int64_t room = limits.context - prompt_tokens;
  if (room < 1)
    bad(r.endpoint == Endpoint::chat ? "messages" : "prompt",
        fmt::format("the prompt has {} tokens but the context holds {}: shorten it", prompt_tokens,
                    limits.context));
  if (!r.max_tokens_given) {
    r.config.max_new_tokens = r.endpoint == Endpoint::chat ? room : std::min<int64_t>(16, room);
  } else if (r.config.max_new_tokens > room) {
    bad("max_tokens", fmt::format("the prompt's {} tokens and max_tokens {} exceed the context "
                                  "of {}: ask for at most {}",
                                  prompt_tokens, r.config.max_new_tokens, limits.context, room));
  }
}

namespace {
io::Json head(Endpoint e, const Answer& a, bool chunk) {
  io::Json out = io::Json::object();
  out["id"] = io::Json(a.id);
  out["object"] =
      io::Json(e == Endpoint::chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                   : "text_completion");
  out["created"] = io::Json(a.created);
  out["model"] = io::Json(a.model);
  return out;
}
io::Json usage(const Answer& a) {
  io::Json u = io::Json::object();
  u["prompt_tokens"] = io::Json(a.prompt_tokens);
  u["completion_tokens"] = io::Json(a.completion_tokens);
  u["total_tokens"] = io::Json(a.prompt_tokens + a.completion_tokens);
  return u;
}
io::Json null_or(const std::string& s) { return s.empty() ? io::Json() : io::Json(s); }
}  // namespace

io::Json response_body(Endpoint e, const Answer& a) {
  io::Json out = head(e, a, false);
  io::Json choice = io::Json::object();
  choice["index"] = io::Json(int64_t(0));
  if (e == Endpoint::chat) {
    io::Json message = io::Json::object();
    message["role"] = io::Json("assistant");
    message["content"] = io::Json(a.text);
    choice["message"] = std::move(message);
  } else {
    choice["text"] = io::Json(a.text);
  }
  choice["logprobs"] = io::Json();
  choice["finish_reason"] = io::Json(a.finish_reason);
  out["choices"] = io::Json(io::Json::Array{std::move(choice)});
  out["usage"] = usage(a);
  return out;
}

io::Json chunk_body(Endpoint e, const Answer& a, const std::string& piece, bool first,
                    const std::string& finish_reason) {
  io::Json out = head(e, a, true);
  io::Json choice = io::Json::object();
  choice["index"] = io::Json(int64_t(0));
  if (e == Endpoint::chat) {
    io::Json delta = io::Json::object();
    if (first) delta["role"] = io::Json("assistant");
    if (finish_reason.empty()) delta["content"] = io::Json(piece);
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = io::Json(piece);
  }
  choice["logprobs"] = io::Json();
  choice["finish_reason"] = null_or(finish_reason);
  out["choices"] = io::Json(io::Json::Array{std::move(choice)});
  return out;
}

io::Json usage_chunk(Endpoint e, const Answer& a) {
  io::Json out = head(e, a, true);
  out["choices"] = io::Json::array();
  out["usage"] = usage(a);
  return out;
}

}  // namespace redco::serve
