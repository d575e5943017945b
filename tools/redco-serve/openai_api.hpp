#pragma once
// The OpenAI API's request and response bodies, as redco-serve speaks them:
// /v1/completions and /v1/chat/completions, whole or streamed (server-sent
// events), and the error object. Pure functions of JSON: no sockets, no model.
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "redco/generation/batcher.hpp"
#include "redco/io/json.hpp"

namespace redco::serve {

// A request the client got wrong: HTTP `status` with OpenAI's error object.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, std::string param, const std::string& message)
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)) {}
  int status;
  std::string type;   // "invalid_request_error", "not_found_error", ...
  std::string param;  // the field at fault ("" when none)
};
// {"error": {"message", "type", "param", "code"}}
io::Json error_body(const std::string& message, const std::string& type,
                    const std::string& param = "");

enum class Endpoint { completions, chat };

// What the server was started with that a request may not exceed or change.
struct Limits {
  std::string model_name;  // what "model" must name (when given)
  int64_t context = 2048;  // prompt + new tokens
  int64_t vocab_size = 0;
  generation::GenerationConfig defaults{};  // eos ids, pad: the checkpoint's
};

// One request, parsed and checked: either prompt_text (text to tokenise, or a
// chat to render: messages), or prompt_ids.
struct Request {
  Endpoint endpoint = Endpoint::completions;
  std::optional<std::string> prompt_text;
  std::vector<int64_t> prompt_ids;
  io::Json messages;  // chat: the conversation
  bool stream = false, include_usage = false;
  bool max_tokens_given = false;
  generation::GenerationConfig config{};
};

// Parses and checks a body; throws ApiError (400, or 404 for an unknown model)
// naming the field and what it takes.
Request parse_request(const std::string& body, Endpoint endpoint, const Limits& limits);
// Once the prompt's length is known: max_tokens defaults (completions: 16,
// chat: what the context leaves) and prompt + max_tokens within the context.
void fit_to_context(Request& r, int64_t prompt_tokens, const Limits& limits);

// What a finished request said, for the response bodies.
struct Answer {
  std::string id, model;
  int64_t created = 0;
  std::string text;
  std::string finish_reason;  // "stop" or "length"
  int64_t prompt_tokens = 0, completion_tokens = 0;
};
io::Json response_body(Endpoint e, const Answer& a);
// One server-sent event's data: a piece of text (first: the chat's role
// delta first), or the end (finish_reason set, text empty), or the usage
// chunk (include_usage).
io::Json chunk_body(Endpoint e, const Answer& a, const std::string& piece, bool first,
                    const std::string& finish_reason);
io::Json usage_chunk(Endpoint e, const Answer& a);

}  // namespace redco::serve
