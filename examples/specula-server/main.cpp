// specula-server: a local server with OpenAI's API over specula's C API, for the assistants
// and apps that talk to llama.cpp's llama-server or whisper.cpp's server.
//
//   specula-server -m target.gguf [-md draft.gguf] [--asr-model whisper.bin [--asr-draft d.bin]]
//                  [--host 127.0.0.1] [--port 8080] [-np SLOTS] [-c CTX] [--api-key KEY]
//
// Each slot is a session on the shared model (with the draft, where there is one); a request
// takes a free slot or waits in a bounded queue (429 when it is full). The busy slots' generation
// steps share one forward each round (specula.h), so throughput grows with the clients.
// docs/PROGRAMS.md lists the endpoints and flags.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "openai.h"
#include "specula.h"
#include "token_list.h"

using specula::server::ApiError;
using specula::server::Json;

namespace {

struct Options {
    std::string model, draft, asr_model, asr_draft, asr_draft_tokens, alias, chat_template, api_key;
    std::string host = "127.0.0.1", backend = "auto";
    int port = 8080, slots = 1, queue = 16, threads = 0, lookup = 0;
    uint32_t ctx = 0;
    int32_t max_tokens = 4096;
    size_t max_body_mb = 64;
};

int64_t now_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// Whether the client of a request whose response is written whole has gone. cpp-httplib (0.11)
// gives a handler no socket and writes such a response only once it returns, so the connection
// is found among the process's sockets by its two ends (the request's addresses and ports), once
// per request, and its peer is checked as generation goes: a peer that closed makes the socket
// readable with nothing to read (a request sent after this one on the same connection is data,
// not a close).
class PeerWatch {
  public:
    explicit PeerWatch(const httplib::Request& req) {
        std::error_code ec;
        for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
            int fd = -1;
            try {
                fd = std::stoi(entry.path().filename().string());
            } catch (const std::exception&) {
                continue;
            }
            if (is_connection(fd, req)) {
                fd_ = fd;
                break;
            }
        }
    }
    bool gone() const {
        if (fd_ < 0) return false;
        pollfd p{fd_, POLLIN | POLLRDHUP, 0};
        if (poll(&p, 1, 0) <= 0) return false;
        if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) return true;
        char c = 0;
        return recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }

  private:
    static std::string address(const sockaddr_storage& a, int* port) {
        char text[INET6_ADDRSTRLEN] = {};
        if (a.ss_family == AF_INET) {
            const auto& in = reinterpret_cast<const sockaddr_in&>(a);
            *port = ntohs(in.sin_port);
            inet_ntop(AF_INET, &in.sin_addr, text, sizeof text);
        } else if (a.ss_family == AF_INET6) {
            const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
            *port = ntohs(in6.sin6_port);
            inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text);
        }
        return text;
    }
    static bool is_connection(int fd, const httplib::Request& req) {
        sockaddr_storage local{}, peer{};
        socklen_t local_size = sizeof local, peer_size = sizeof peer;
        if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_size) != 0 ||
            getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0)
            return false;
        int local_port = -1, peer_port = -1;
        const std::string local_address = address(local, &local_port);
        const std::string peer_address = address(peer, &peer_port);
        return local_port == req.local_port && peer_port == req.remote_port &&
               local_address == req.local_addr && peer_address == req.remote_addr;
    }
    int fd_ = -1;
};

std::string random_id(const char* prefix) {
    static std::atomic<uint64_t> counter{0};
    thread_local std::mt19937_64 rng{std::random_device{}()};
    char b[64];
    std::snprintf(b, sizeof b, "%s-%016llx%04llx", prefix, static_cast<unsigned long long>(rng()),
                  static_cast<unsigned long long>(counter++ & 0xFFFF));
    return b;
}

void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(e.body().dump(), "application/json");
}

ApiError library_error(specula_status s, const char* what) {
    const int status = s == SPECULA_ERR_INVALID_ARGUMENT || s == SPECULA_ERR_CONTEXT_FULL ||
                               s == SPECULA_ERR_UNSUPPORTED || s == SPECULA_ERR_FORMAT
                           ? 400
                           : 500;
    return ApiError{status, std::string(what) + ": " + specula_last_error(),
                    status == 400 ? "invalid_request_error" : "server_error"};
}

// Slots taken by requests, and a bounded queue of requests waiting for one.
class Slots {
  public:
    Slots(int n, int queue) : max_waiting_(queue) {
        for (int i = n - 1; i >= 0; --i)
            free_.push_back(i);
    }
    // A free slot's index (waiting for one), or -1 when the queue is full.
    int acquire() {
        std::unique_lock lock(mutex_);
        if (free_.empty()) {
            if (waiting_ >= max_waiting_) return -1;
            ++waiting_;
            cv_.wait(lock, [&] { return !free_.empty(); });
            --waiting_;
        }
        const int slot = free_.back();
        free_.pop_back();
        return slot;
    }
    int idle() {
        std::lock_guard lock(mutex_);
        return int(free_.size());
    }
    void release(int slot) {
        {
            std::lock_guard lock(mutex_);
            free_.push_back(slot);
        }
        cv_.notify_one();
    }

  private:
    std::mutex mutex_;
    std::condition_variable cv_;
    std::vector<int> free_;
    int waiting_ = 0, max_waiting_;
};

// A slot held for one request (released when the last copy goes: after a stream ends).
class Lease {
  public:
    Lease(Slots& slots, int slot) : slots_(slots), slot_(slot) {}
    ~Lease() { slots_.release(slot_); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

  private:
    Slots& slots_;
    int slot_;
};

class Server {
  public:
    explicit Server(Options o) : o_(std::move(o)), slots_(o_.slots, o_.queue) {}
    ~Server();
    int load();
    int serve();

  private:
    void route();
    void models(httplib::Response& res) const;
    void text(const httplib::Request& req, httplib::Response& res, bool chat);
    void transcription(const httplib::Request& req, httplib::Response& res);
    // The prompt's tokens, or an error.
    bool prompt_tokens(const specula::server::TextRequest& r, std::vector<int32_t>* tokens,
                       ApiError* error) const;

    Options o_;
    Slots slots_;
    httplib::Server http_;
    specula_backend* backend_ = nullptr;
    specula_model *model_ = nullptr, *draft_ = nullptr;
    std::vector<specula_session*> sessions_;
    std::string model_id_, template_;
    specula_asr_model *asr_ = nullptr, *asr_draft_ = nullptr;
    specula_asr_context* asr_context_ = nullptr;
    std::mutex asr_mutex_;  // one transcription at a time (an ASR context is single-threaded)
    std::atomic<uint64_t> tokens_generated_{0};  // over every request, for /health
};

Server::~Server() {
    for (specula_session* s : sessions_)
        specula_session_free(s);
    specula_asr_context_free(asr_context_);
    specula_asr_model_free(asr_draft_);
    specula_asr_model_free(asr_);
    specula_model_free(draft_);
    specula_model_free(model_);
    specula_backend_free(backend_);
}

int fail(const char* what, specula_status s) {
    std::fprintf(stderr, "specula-server: %s: %s (%s)\n", what, specula_last_error(),
                 specula_status_name(s));
    return 1;
}

int Server::load() {
    specula_backend_params bp = specula_backend_default_params();
    specula_status s = specula_backend_kind_from_name(o_.backend.c_str(), &bp.kind);
    if (s != SPECULA_OK) return fail("--backend", s);
    bp.n_threads = o_.threads;
    if ((s = specula_backend_create(&bp, &backend_)) != SPECULA_OK) return fail("backend", s);
    if ((s = specula_model_load(backend_, o_.model.c_str(), nullptr, &model_)) != SPECULA_OK)
        return fail(o_.model.c_str(), s);
    if (!o_.draft.empty() &&
        (s = specula_model_load(backend_, o_.draft.c_str(), nullptr, &draft_)) != SPECULA_OK)
        return fail(o_.draft.c_str(), s);
    model_id_ = o_.alias.empty() ? std::filesystem::path(o_.model).filename().string() : o_.alias;
    // The model's chat template, else the one asked for, else ChatML (as llama-server does).
    template_ = o_.chat_template;
    const specula_chat_message probe{"user", "hi"};
    size_t length = 0;
    s = specula_chat_apply_template(model_, template_.empty() ? nullptr : template_.c_str(), &probe,
                                    1, true, nullptr, 0, &length);
    if (s == SPECULA_ERR_UNSUPPORTED && template_.empty()) {
        std::fprintf(stderr,
                     "specula-server: the model has no chat template specula knows: "
                     "chats are written as ChatML\n");
        template_ = "chatml";
    } else if (s != SPECULA_OK && s != SPECULA_ERR_BUFFER_TOO_SMALL) {
        return fail("--chat-template", s);
    }
    if (o_.ctx == 0) {  // the model's training context, within a bound on memory
        specula_model_info info{};
        (void)specula_model_get_info(model_, &info);
        o_.ctx = uint32_t(std::clamp(info.n_ctx_train, 16, 8192));
    }
    specula_session_params sp = specula_session_default_params();
    sp.n_ctx = o_.ctx;
    sp.draft = draft_;
    sp.lookup_ngram = o_.lookup;
    for (int i = 0; i < o_.slots; ++i) {
        specula_session* session = nullptr;
        if ((s = specula_session_create(model_, &sp, &session)) != SPECULA_OK)
            return fail("session", s);
        sessions_.push_back(session);
    }
    if (!o_.asr_model.empty()) {
        if ((s = specula_asr_model_load(backend_, o_.asr_model.c_str(), nullptr, &asr_)) !=
            SPECULA_OK)
            return fail(o_.asr_model.c_str(), s);
        std::vector<int32_t> tokens;  // a restricted draft's (specula_asr_draft_load)
        if (!o_.asr_draft_tokens.empty() && !read_token_list(o_.asr_draft_tokens, &tokens)) {
            std::fprintf(stderr, "specula-server: %s: not a list of token ids\n",
                         o_.asr_draft_tokens.c_str());
            return 1;
        }
        if (!o_.asr_draft.empty() &&
            (s = specula_asr_draft_load(backend_, o_.asr_draft.c_str(), nullptr, tokens.data(),
                                        tokens.size(), &asr_draft_)) != SPECULA_OK)
            return fail(o_.asr_draft.c_str(), s);
        if ((s = specula_asr_context_create(asr_, &asr_context_)) != SPECULA_OK)
            return fail("asr context", s);
    }
    return 0;
}

void Server::models(httplib::Response& res) const {
    Json list = Json::array();
    list.push_back(
        {{"id", model_id_}, {"object", "model"}, {"created", 0}, {"owned_by", "specula"}});
    if (asr_ != nullptr)
        list.push_back({{"id", std::filesystem::path(o_.asr_model).filename().string()},
                        {"object", "model"},
                        {"created", 0},
                        {"owned_by", "specula"}});
    res.set_content(Json{{"object", "list"}, {"data", list}}.dump(), "application/json");
}

bool Server::prompt_tokens(const specula::server::TextRequest& r, std::vector<int32_t>* tokens,
                           ApiError* error) const {
    std::string text;
    uint32_t flags = SPECULA_TOKENIZE_ADD_BOS;
    if (r.chat) {
        std::vector<specula_chat_message> messages;
        for (const auto& m : r.messages)
            messages.push_back({m.role.c_str(), m.content.c_str()});
        size_t length = 0;
        const char* tmpl = template_.empty() ? nullptr : template_.c_str();
        specula_status s = specula_chat_apply_template(model_, tmpl, messages.data(),
                                                       messages.size(), true, nullptr, 0, &length);
        text.resize(length);
        if (s == SPECULA_ERR_BUFFER_TOO_SMALL)
            s = specula_chat_apply_template(model_, tmpl, messages.data(), messages.size(), true,
                                            text.data(), text.size(), &length);
        if (s != SPECULA_OK) {
            *error = library_error(s, "messages");
            return false;
        }
        flags = SPECULA_TOKENIZE_PARSE_SPECIAL;  // the template writes the BOS
    } else {
        text = r.prompt;
    }
    size_t n = 0;
    tokens->resize(text.size() + 2);
    specula_status s = specula_tokenize(model_, text.data(), text.size(), flags, tokens->data(),
                                        tokens->size(), &n);
    if (s == SPECULA_ERR_BUFFER_TOO_SMALL) {
        tokens->resize(n);
        s = specula_tokenize(model_, text.data(), text.size(), flags, tokens->data(),
                             tokens->size(), &n);
    }
    if (s != SPECULA_OK) {
        *error = library_error(s, "prompt");
        return false;
    }
    tokens->resize(n);
    if (tokens->empty()) {
        *error = ApiError{400, "the prompt is empty", "invalid_request_error", "prompt"};
        return false;
    }
    return true;
}

// One generation on a slot's session: its text goes through `stop` and, when streamed, out
// through `emit` as it may be sent; a response written whole reads `stop.text()` at the end and
// asks `present` after each token. false from either: the client is gone, generation stops.
struct Outcome {
    specula_status status = SPECULA_OK;
    std::string finish = "length";
    specula::server::Usage usage;
};

Outcome generate(specula_session* session, const std::vector<int32_t>& prompt, int32_t max_tokens,
                 specula::server::StopText& stop,
                 const std::function<bool(const std::string&)>& emit,
                 const std::function<bool()>& present, std::atomic<uint64_t>& counter) {
    Outcome out;
    out.usage.prompt_tokens = int64_t(prompt.size());
    if ((out.status = specula_session_eval(session, prompt.data(), prompt.size())) != SPECULA_OK)
        return out;
    struct State {
        specula::server::StopText& stop;
        const std::function<bool(const std::string&)>& emit;
        const std::function<bool()>& present;
        std::atomic<uint64_t>& counter;
        bool gone = false;
    } state{stop, emit, present, counter};
    specula_generate_params gp = specula_generate_default_params();
    gp.max_tokens = max_tokens;
    gp.stop_at_eos = true;
    gp.on_token_user_data = &state;
    gp.on_token = [](int32_t, const char* piece, size_t length, void* user) {
        auto& st = *static_cast<State*>(user);
        ++st.counter;
        const bool stopped = st.stop.add(std::string_view(piece, length));
        if ((st.emit && !st.emit(st.stop.release())) || (st.present && !st.present()))
            st.gone = true;
        return !stopped && !st.gone;
    };
    size_t n = 0;
    out.status = specula_generate(session, &gp, nullptr, 0, &n);
    out.usage.completion_tokens = int64_t(n);
    specula_session_stats stats{};
    (void)specula_session_get_stats(session, &stats);
    out.usage.drafted = stats.n_drafted;
    out.usage.evaluated = stats.n_evaluated;
    out.usage.accepted = stats.n_accepted;
    out.usage.steps = stats.n_steps;
    if (state.gone) out.status = SPECULA_ERR_ABORTED;
    if (out.status == SPECULA_ERR_CONTEXT_FULL)
        out.status = SPECULA_OK;  // "length"
    else if (stop.stopped() || int64_t(n) < max_tokens)
        out.finish = "stop";
    return out;
}

void Server::text(const httplib::Request& req, httplib::Response& res, bool chat) {
    ApiError error;
    specula::server::Limits limits;
    limits.max_tokens = o_.max_tokens;
    auto request = specula::server::parse_text_request(req.body, chat, limits, &error);
    if (!request) return send_error(res, error);
    std::vector<int32_t> prompt;
    if (!prompt_tokens(*request, &prompt, &error)) return send_error(res, error);
    const int64_t room = int64_t(o_.ctx) - int64_t(prompt.size());
    if (room < 1 || (request->max_tokens > 0 && request->max_tokens > room))
        return send_error(res, ApiError{400,
                                        "the prompt (" + std::to_string(prompt.size()) +
                                            " tokens) and max_tokens exceed the context of " +
                                            std::to_string(o_.ctx) + " tokens",
                                        "invalid_request_error", "messages"});
    const int32_t max_tokens = request->max_tokens > 0
                                   ? request->max_tokens
                                   : int32_t(std::min<int64_t>(room, o_.max_tokens));

    const int slot = slots_.acquire();
    if (slot < 0)
        return send_error(
            res, ApiError{429, "every slot is busy and the queue is full", "rate_limit_error"});
    auto lease = std::make_shared<Lease>(slots_, slot);
    specula_session* session = sessions_[size_t(slot)];
    const uint64_t seed = request->seeded ? request->seed : std::random_device{}();
    const float temperature = request->temperature;
    specula_status s =
        specula_session_set_sampling(session, temperature, request->top_k, request->top_p, seed);
    if (s != SPECULA_OK) return send_error(res, library_error(s, "sampling"));

    const std::string id = random_id(chat ? "chatcmpl" : "cmpl");
    const int64_t created = now_seconds();
    auto r = std::make_shared<specula::server::TextRequest>(std::move(*request));
    if (!r->stream) {
        specula::server::StopText stop(r->stop);
        const PeerWatch peer(req);
        Outcome out = generate(
            session, prompt, max_tokens, stop, nullptr, [&] { return !peer.gone(); },
            tokens_generated_);
        if (out.status == SPECULA_ERR_ABORTED) return;  // the client left: nobody reads a reply
        if (out.status != SPECULA_OK)
            return send_error(res, library_error(out.status, "generation"));
        const std::string text =
            specula::server::valid_utf8((r->echo ? r->prompt : "") + stop.text());
        res.set_content(specula::server::completion_response(*r, id, model_id_, created, text,
                                                             out.finish, out.usage)
                            .dump(),
                        "application/json");
        return;
    }
    auto p = std::make_shared<std::vector<int32_t>>(std::move(prompt));
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [this, lease, session, r, p, id, created,
                                                           max_tokens](size_t,
                                                                       httplib::DataSink& sink) {
        const auto event = [&](const Json& j) {
            const std::string line = "data: " + j.dump() + "\n\n";
            return sink.write(line.data(), line.size());
        };
        bool first = true;
        const auto chunk = [&](const std::string& text, const std::string& finish) {
            if (text.empty() && finish.empty() && !first) return true;
            const bool ok = event(
                specula::server::completion_chunk(*r, id, model_id_, created, text, finish, first));
            first = false;
            return ok;
        };
        if (r->echo && !chunk(specula::server::valid_utf8(r->prompt), "")) return false;
        specula::server::StopText stop(r->stop);
        Outcome out = generate(
            session, *p, max_tokens, stop, [&](const std::string& text) { return chunk(text, ""); },
            nullptr, tokens_generated_);
        if (out.status == SPECULA_ERR_ABORTED) return false;  // the client left
        if (out.status != SPECULA_OK) {
            event(library_error(out.status, "generation").body());
        } else {
            if (!chunk(stop.finish(), out.finish)) return false;
            if (r->include_usage) {
                Json usage =
                    specula::server::completion_chunk(*r, id, model_id_, created, "", "", false);
                usage["choices"] = Json::array();
                usage["usage"] = out.usage.json();
                event(usage);
            }
        }
        const std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
    });
}

void Server::transcription(const httplib::Request& req, httplib::Response& res) {
    if (asr_ == nullptr)
        return send_error(res, ApiError{404, "this server has no speech model (--asr-model)",
                                        "invalid_request_error", "model"});
    if (!req.is_multipart_form_data() || !req.has_file("file"))
        return send_error(res, ApiError{400, "a multipart/form-data body with a 'file' is needed",
                                        "invalid_request_error", "file"});
    std::vector<std::pair<std::string, std::string>> fields;
    for (const auto& [name, part] : req.files)
        if (name != "file") fields.emplace_back(name, part.content);
    ApiError error;
    const auto request = specula::server::parse_transcription_fields(fields, &error);
    if (!request) return send_error(res, error);
    const std::string audio = req.get_file_value("file").content;

    specula_asr_params p = specula_asr_default_params();
    p.language = request->language.empty() ? nullptr : request->language.c_str();
    p.temperature = request->temperature;
    p.draft = asr_draft_;
    std::vector<specula::server::Segment> segments;
    specula_asr_timings timings{};
    {
        std::lock_guard lock(asr_mutex_);
        const specula_status s =
            specula_asr_transcribe_memory(asr_context_, audio.data(), audio.size(), &p);
        if (s != SPECULA_OK) return send_error(res, library_error(s, "file"));
        for (size_t i = 0; i < specula_asr_segment_count(asr_context_); ++i) {
            specula_asr_segment seg{};
            if (specula_asr_get_segment(asr_context_, i, &seg) == SPECULA_OK)
                segments.push_back({seg.t0_ms, seg.t1_ms, seg.text});
        }
        (void)specula_asr_get_timings(asr_context_, &timings);
    }
    std::string content_type;
    const std::string body = specula::server::format_transcript(
        segments, request->response_format, timings.language, timings.audio_seconds, &content_type);
    res.set_content(body, content_type);
}

void Server::route() {
    http_.set_payload_max_length(o_.max_body_mb << 20);
    // Enough workers for every slot and every queued request, and a few to refuse the rest.
    const size_t workers = size_t(o_.slots + o_.queue + 4);
    http_.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
    http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        if (o_.api_key.empty() || req.path.rfind("/v1/", 0) != 0)
            return httplib::Server::HandlerResponse::Unhandled;
        if (req.get_header_value("Authorization") == "Bearer " + o_.api_key)
            return httplib::Server::HandlerResponse::Unhandled;
        send_error(res, ApiError{401, "invalid API key", "authentication_error"});
        return httplib::Server::HandlerResponse::Handled;
    });
    http_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return;
        const std::string message = res.status == 404   ? "no such endpoint: " + req.path
                                    : res.status == 413 ? "the request body is too large"
                                                        : "bad request";
        send_error(res, ApiError{res.status, message, "invalid_request_error"});
    });
    http_.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
            send_error(res, ApiError{500, "internal error", "server_error"});
        });
    http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
        const int idle = slots_.idle();
        res.set_content(Json{{"status", "ok"},
                             {"slots_idle", idle},
                             {"slots_processing", o_.slots - idle},
                             {"tokens_generated", tokens_generated_.load()}}
                            .dump(),
                        "application/json");
    });
    http_.Get("/v1/models",
              [this](const httplib::Request&, httplib::Response& res) { models(res); });
    http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
        text(req, res, true);
    });
    http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
        text(req, res, false);
    });
    http_.Post(
        "/v1/audio/transcriptions",
        [this](const httplib::Request& req, httplib::Response& res) { transcription(req, res); });
}

httplib::Server* g_server = nullptr;

int Server::serve() {
    route();
    if (o_.port == 0)
        o_.port = http_.bind_to_any_port(o_.host.c_str());
    else if (!http_.bind_to_port(o_.host.c_str(), o_.port))
        o_.port = -1;
    if (o_.port <= 0) {
        std::fprintf(stderr, "specula-server: cannot listen on %s:%d\n", o_.host.c_str(), o_.port);
        return 1;
    }
    g_server = &http_;
    std::signal(SIGINT, [](int) { g_server->stop(); });
    std::signal(SIGTERM, [](int) { g_server->stop(); });
    std::fprintf(stderr, "specula-server: listening on http://%s:%d (%d slots, model %s)\n",
                 o_.host.c_str(), o_.port, o_.slots, model_id_.c_str());
    std::fflush(stderr);
    http_.listen_after_bind();
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    CLI::App app{"specula-server: OpenAI's API for a text model (and a speech model)"};
    app.add_option("-m,--model", o.model, "the text model (GGUF)")->required();
    app.add_option("--model-draft", o.draft, "a draft model for speculative decoding (also -md)");
    app.add_option("--lookup", o.lookup, "prompt lookup drafts: the longest suffix looked up")
        ->check(CLI::Range(0, SPECULA_MAX_LOOKUP_NGRAM));
    app.add_option("--asr-model", o.asr_model, "a Whisper model (whisper.cpp's .bin)");
    app.add_option("--asr-draft", o.asr_draft, "its draft (Distil-Whisper-shaped)");
    app.add_option("--asr-draft-tokens", o.asr_draft_tokens,
                   "the token ids the speech draft may propose (a file, as specula-asr's "
                   "--draft-tokens)")
        ->needs("--asr-draft");
    app.add_option("--host", o.host, "the address to listen on (loopback by default)");
    app.add_option("--port", o.port, "the port (0: any free one, printed)")
        ->check(CLI::Range(0, 65535));
    app.add_option("--slots", o.slots, "concurrent generations (also -np)")
        ->check(CLI::Range(1, 256));
    app.add_option("--queue", o.queue, "requests that may wait for a slot (more: 429)")
        ->check(CLI::Range(0, 4096));
    app.add_option("--ctx-size", o.ctx,
                   "each slot's context (also -c; 0: the model's, at most 8192)")
        ->check(CLI::Range(0, 1 << 20));
    app.add_option("--max-tokens", o.max_tokens, "the most tokens a request may ask for")
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--max-body-mb", o.max_body_mb, "the largest request body, in MiB");
    app.add_option("--api-key", o.api_key, "require 'Authorization: Bearer KEY' on /v1/");
    app.add_option("--alias", o.alias, "the model's id in the API (default: the file's name)");
    app.add_option("--chat-template", o.chat_template,
                   "a Jinja template or family name instead of the model's");
    app.add_option("--backend", o.backend, "auto, cpu, vulkan or cuda");
    app.add_option("--threads", o.threads, "cpu threads (0 = all; also -t)");
    // llama-server's spellings that CLI11 does not take as short options.
    std::vector<std::string> args(argv + 1, argv + argc);
    for (auto& a : args) {
        if (a == "-md") a = "--model-draft";
        if (a == "-np") a = "--slots";
        if (a == "-c") a = "--ctx-size";
        if (a == "-t") a = "--threads";
    }
    std::reverse(args.begin(), args.end());
    try {
        app.parse(args);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    Server server(o);
    if (int rc = server.load(); rc != 0) return rc;
    return server.serve();
}
