// One request from its body to its last byte (server.hpp's Server::handle):
// parse, tokenise, queue in the batcher, then write what it generates, whole
// or as server-sent events, until it ends or the client goes.
//
// Its tokens travel from the batcher's thread to the connection's thread
// through a Session: the batcher's callbacks append text under its lock, the
// connection's content provider waits on it and writes what came. A write
// that fails means the client is gone: the request is cancelled and its KV
// cache row freed at the next step. A silent connection (queued, or a long
// prefill) is written a heartbeat every second (an SSE comment, or whitespace
// before a JSON body, which JSON allows), so a client that left is found then,
// not when its request would have ended.
#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <mutex>
#include <utility>
#include <vector>

#include "server.hpp"

namespace redco::serve {
namespace {

using Clock = std::chrono::steady_clock;

struct Session {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::string> pending;  // text not yet written, a piece per token
  std::string error;                 // the model's failure, when it failed
  bool finished = false, gone = false;
  generation::Finish why = generation::Finish::stop;
  int64_t tokens = 0;
  Clock::time_point start = Clock::now(), first_token{};
};

generation::RequestEvents events_of(const std::shared_ptr<Session>& s) {
  return {.on_token =
              [s](int64_t, std::string_view text) {
                std::lock_guard lock(s->mutex);
                if (s->tokens++ == 0) s->first_token = Clock::now();
                // An event per token, even one whose text is held back (a
                // partial character, a possible stop string) or empty (a
                // model served without a tokenizer, prompts as ids).
                s->pending.emplace_back(text);
                s->changed.notify_one();
                return !s->gone;
              },
          .on_finish =
              [s](generation::Finish why, std::string_view text) {
                std::lock_guard lock(s->mutex);
                if (why == generation::Finish::error)
                  s->error = text;
                else if (!text.empty())
                  s->pending.emplace_back(text);
                s->finished = true;
                s->why = why;
                s->changed.notify_one();
              }};
}

void json_reply(httplib::Response& res, int status, const io::Json& body) {
  res.status = status;
  res.set_content(body.dump() + "\n", "application/json");
}

bool write(httplib::DataSink& sink, const std::string& s) { return sink.write(s.data(), s.size()); }
bool write_event(httplib::DataSink& sink, const io::Json& data) {
  return write(sink, "data: " + data.dump() + "\n\n");
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

void Server::handle(const httplib::Request& req, httplib::Response& res, Endpoint e) {
  const std::string endpoint = e == Endpoint::chat ? "chat" : "completions";
  auto session = std::make_shared<Session>();
  Request r;
  Answer a;
  std::optional<int64_t> id;
  try {
    r = parse_request(req.body, e, options_.limits);
    const std::vector<int64_t> ids = prompt_ids(r);
    fit_to_context(r, int64_t(ids.size()), options_.limits);
    a.prompt_tokens = int64_t(ids.size());
    id = batcher_.submit(ids, r.config, events_of(session));
  } catch (const ApiError& x) {
    json_reply(res, x.status, error_body(x.what(), x.type, x.param));
    metrics_.request_done(endpoint, x.status);
    return;
  } catch (const std::exception& x) {  // the batcher's checks: the request's fault
    json_reply(res, 400, error_body(x.what(), "invalid_request_error"));
    metrics_.request_done(endpoint, 400);
    return;
  }
  if (!id) {  // back-pressure: the queue is full
    res.set_header("Retry-After", "1");
    json_reply(res, 429,
               error_body(fmt::format("the server is busy ({} requests waiting): retry later",
                                      batcher_.queued()),
                          "rate_limit_error"));
    metrics_.request_done(endpoint, 429);
    return;
  }
  a.id = fmt::format("{}-{}", e == Endpoint::chat ? "chatcmpl" : "cmpl", next_id_++);
  a.model = options_.limits.model_name;
  a.created = int64_t(std::time(nullptr));
  const bool stream = r.stream, usage = r.include_usage;
  const auto heartbeat = std::chrono::duration<double>(options_.heartbeat_seconds);
  // Waits for text or the end; false when the client is gone (a write failed).
  auto provider = [session, a, e, stream, usage, heartbeat, first = true](
                      size_t, httplib::DataSink& sink) mutable {
    Session& s = *session;
    std::unique_lock lock(s.mutex);
    if (!s.changed.wait_for(lock, heartbeat, [&] { return s.finished || !s.pending.empty(); })) {
      lock.unlock();  // nothing for a while: is the client still there?
      return write(sink, stream ? ": keep-alive\n\n" : "\n");
    }
    const std::vector<std::string> pieces = std::exchange(s.pending, {});
    const bool finished = s.finished;
    const generation::Finish why = s.why;
    const std::string error = s.error;
    a.completion_tokens = s.tokens;
    lock.unlock();
    if (stream && first && pieces.empty() && e == Endpoint::chat) {  // the role, at once
      if (!write_event(sink, chunk_body(e, a, "", true, ""))) return false;
      first = false;
    }
    for (const std::string& piece : pieces) {  // an event per token, as OpenAI streams
      if (stream && !write_event(sink, chunk_body(e, a, piece, first, ""))) return false;
      if (!stream) a.text += piece;
      first = false;
    }
    if (!finished) return true;
    if (why == generation::Finish::error) {  // the model failed: say so, in the stream's format
      const io::Json err = error_body("the model failed: " + error, "server_error");
      if (stream)
        write_event(sink, err);
      else
        write(sink, err.dump() + "\n");
      sink.done();
      return true;
    }
    a.finish_reason = why == generation::Finish::length ? "length" : "stop";
    if (stream) {
      if (!write_event(sink, chunk_body(e, a, "", first, a.finish_reason))) return false;
      if (usage && !write_event(sink, usage_chunk(e, a))) return false;
      if (!write(sink, "data: [DONE]\n\n")) return false;
    } else if (!write(sink, response_body(e, a).dump() + "\n")) {
      return false;
    }
    sink.done();
    return true;
  };
  // Runs when the response ends: a client gone mid-way cancels its request.
  auto release = [this, session, id = *id, endpoint](bool success) {
    {
      std::lock_guard lock(session->mutex);
      if (!success) session->gone = true;
    }
    if (!success) batcher_.cancel(id);
    const Session& s = *session;
    if (success && s.tokens > 0)
      metrics_.latency(seconds(s.first_token - s.start), seconds(Clock::now() - s.start), s.tokens);
    metrics_.request_done(endpoint, success ? 200 : 499);  // 499: the client closed it
  };
  res.set_chunked_content_provider(stream ? "text/event-stream" : "application/json",
                                   std::move(provider), std::move(release));
  if (stream) res.set_header("Cache-Control", "no-cache");
}

}  // namespace redco::serve
