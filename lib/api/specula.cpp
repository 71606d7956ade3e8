// The C ABI: handles, parameter defaults, and the translation of Status (and
// of any exception from the standard library) into specula_status.
#include "specula.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "api/internal.h"
#include "backend/backend.h"
#include "backend/factory.h"
#include "core/log.h"
#include "decode/generator.h"
#include "models/llama.h"
#include "models/registry.h"
#include "tokenizer/chat.h"

using namespace specula;
using namespace specula::api;

std::string& specula::api::last_error() {
    thread_local std::string message;
    return message;
}

namespace {

// Generation steps that sessions of one model ask for at the same time (each from its own
// thread) are run together: a waiting step, when none is running, takes every waiting step (up
// to a batch) and runs them under the backend's turn while the others wait, then wakes them.
// Several steps are one plain step each in one forward (LlamaBatch), which reads each weight
// once for all of them; a step alone is the session's own (with its drafts). A group starts
// once every generating session has asked for its step, or after the first asked has waited as
// long as the last group ran (at most kGather): the sessions a group woke ask again within
// microseconds (after their token callbacks), and a group that left one of them out would make
// it step alone next, splitting every later round in two; a session slower than that (an app's
// callback) costs the others no more than the step it would have shared.
struct StepQueue {
    static constexpr std::chrono::milliseconds kGather{5};
    struct Request {
        specula_session* session;
        int max_tokens;
        std::vector<int32_t>* out;
        Status status;
        Clock::time_point asked;
        bool done = false;
    };
    std::mutex mutex;
    std::condition_variable woken;
    std::vector<Request*> waiting;
    int generating = 0;  // threads in specula_generate on the model's sessions
    bool running = false;
    Clock::duration last_run{};  // of the last group
    // Created at the first shared step, under the backend's turn; null while none fits (the
    // steps then run one after another).
    std::unique_ptr<LlamaBatch> batch;
    bool batch_tried = false;
};

// Serial numbers of loaded models: a freed draft's address can be a new model's.
uint64_t next_model_serial() {
    static std::atomic<uint64_t> last{0};
    return ++last;
}
}  // namespace

struct specula_model {
    std::unique_ptr<LlamaModel> impl;
    specula_backend* backend = nullptr;
    StepQueue steps;  // after impl: its batch goes first
    const uint64_t serial = next_model_serial();
    // What the γ policy measured of this target with each draft (by the draft's serial; 0 for
    // none), under the backend's turn: a session starts from what the last one of the pair
    // measured, as a session's next sequence does, instead of paying again for a step of drafts
    // after the prompt and the probes that find a draft which cannot pay.
    std::map<uint64_t, PairMeasurements> measured_with;
};

struct specula_session {
    specula_model* model = nullptr;
    specula_session_params params{};  // as created, with the sampling last set
    std::unique_ptr<LlamaContext> target, draft;
    // What the γ policy measured of the pair: kept when the generator is rebuilt for new
    // sampling settings (specula_session_set_sampling).
    PairMeasurements measurements;
    uint64_t draft_serial = 0;  // the key of `measurements` in the model's measured_with
    std::unique_ptr<Generator> generator;
    specula_session_stats stats{};  // the prompt and timing part; the rest comes from the generator
    // Tokens of the last step that were committed but not reported because generation ended
    // before them (the callback said stop, or EOS came first): the next specula_generate
    // reports them first, as an uninterrupted run would; any other use of the context
    // (evaluating tokens, reading logits) forgets them.
    std::vector<int32_t> unreported;
};

namespace {

// Runs `body` and charges the host waits it caused to the session (the caller holds the turn).
template <typename F>
Status charged(specula_session* s, F&& body) {
    Backend& be = s->model->impl->backend();
    const uint64_t waits0 = be.host_waits();
    Status st = body();
    s->stats.n_host_waits += be.host_waits() - waits0;
    return st;
}

// charged() under the backend's turn.
template <typename F>
Status counted(specula_session* s, F&& body) {
    std::lock_guard turn(s->model->backend->turn);
    return charged(s, std::forward<F>(body));
}

// Runs a group of StepQueue's requests under the backend's turn and sets their statuses.
void run_steps(specula_model& model, std::span<StepQueue::Request* const> group) {
    using Request = StepQueue::Request;
    std::lock_guard turn(model.backend->turn);
    StepQueue& q = model.steps;
    const auto alone = [](Request* r) {
        r->status =
            charged(r->session, [&] { return r->session->generator->step(r->max_tokens, r->out); });
    };
    if (group.size() > 1 && !q.batch_tried) {
        q.batch_tried = true;
        if (!LlamaBatch::create(*model.impl, int(kVerificationColumns), &q.batch).ok())
            log(SPECULA_LOG_WARN, "no memory for a batch of sessions: their steps take turns");
    }
    if (group.size() == 1 || q.batch == nullptr) {
        for (Request* r : group)
            alone(r);
        return;
    }
    // One context length per forward (the contexts share the first one's rotation tables).
    std::vector<Request*> shared;
    std::vector<LlamaContext*> contexts;
    std::vector<int32_t> tokens;
    for (Request* r : group) {
        specula_session& s = *r->session;
        if (s.target->n_ctx() != group.front()->session->target->n_ctx()) {
            alone(r);
            continue;
        }
        int32_t token = 0;
        r->status = charged(&s, [&] { return s.generator->prepare_plain_step(&token); });
        if (!r->status.ok()) continue;
        shared.push_back(r);
        contexts.push_back(s.target.get());
        tokens.push_back(token);
    }
    if (shared.size() == 1) return alone(shared.front());
    if (shared.empty()) return;
    const Status forward = q.batch->record(contexts, tokens);
    for (Request* r : shared) {
        specula_session& s = *r->session;
        r->status = forward.ok()
                        ? charged(&s, [&] { return s.generator->finish_plain_step(r->out); })
                        : forward;
        if (r->status.ok()) ++s.stats.n_shared_steps;
    }
}

// One generation step of a session: with other sessions of its model that step at the same
// time, if there are any (StepQueue).
Status step_together(specula_session* s, int max_tokens, std::vector<int32_t>* out) {
    StepQueue& q = s->model->steps;
    StepQueue::Request me{s, max_tokens, out, Status::Ok(), Clock::now()};
    std::unique_lock lock(q.mutex);
    q.waiting.push_back(&me);
    q.woken.notify_all();  // a gathering group may be complete now
    while (!me.done) {
        if (q.running) {
            q.woken.wait(lock);
            continue;
        }
        if (q.waiting.size() < size_t(q.generating) &&
            q.waiting.size() < size_t(kVerificationColumns)) {
            const auto until = q.waiting.front()->asked +
                               std::min<Clock::duration>(q.last_run, StepQueue::kGather);
            if (Clock::now() < until) {
                q.woken.wait_until(lock, until);
                continue;
            }
        }
        q.running = true;
        const size_t n = std::min(q.waiting.size(), size_t(kVerificationColumns));
        std::vector<StepQueue::Request*> group(q.waiting.begin(),
                                               q.waiting.begin() + std::ptrdiff_t(n));
        q.waiting.erase(q.waiting.begin(), q.waiting.begin() + std::ptrdiff_t(n));
        lock.unlock();
        const auto started = Clock::now();
        try {
            run_steps(*s->model, group);
        } catch (const std::bad_alloc&) {
            for (StepQueue::Request* r : group)
                r->status = OutOfMemory("out of host memory");
        } catch (const std::exception& e) {
            for (StepQueue::Request* r : group)
                r->status = {SPECULA_ERR_INTERNAL, std::string("internal error: ") + e.what()};
        }
        lock.lock();
        q.last_run = Clock::now() - started;
        q.running = false;
        for (StepQueue::Request* r : group)
            r->done = true;
        q.woken.notify_all();
    }
    return me.status;
}

// Any use of the context but generation drops the tokens generation did not report.
void forget_unreported(specula_session& s) {
    s.generator->forget(s.unreported.size());
    s.unreported.clear();
}

// A model from a file or from memory.
Status load_model(specula_backend* backend, std::unique_ptr<MappedFile> file,
                  const specula_model_params& p, const std::string& what, specula_model** out) {
    LlamaModel::Progress progress;
    if (p.progress != nullptr)
        progress = [&p](float f) { return p.progress(f, p.progress_user_data); };
    auto m = std::make_unique<specula_model>();
    m->backend = backend;
    ModelIdentity identity;
    Status s = expect_model(file->bytes(), ModelKind::kText, &identity);
    if (!s.ok()) return Status(s.code(), what + ": " + s.message());
    std::lock_guard turn(backend->turn);
    s = LlamaModel::load(*backend->impl, std::move(file), progress, &m->impl);
    if (!s.ok()) return Status(s.code(), what + ": " + s.message());
    *out = m.release();
    return Status::Ok();
}

// The generator's settings from a session's parameters, or why they are refused.
Status generator_config(const specula_session_params& p, Generator::Config* config) {
    if (!(p.temperature >= 0.0f) || !(p.top_p > 0.0f) || p.top_p > 1.0f || p.top_k < 0)
        return InvalidArgument("temperature must be >= 0, top_p in (0, 1], top_k >= 0");
    const bool greedy = !(p.temperature >= SPECULA_MIN_TEMPERATURE);
    SPECULA_TRY(gamma_settings(p.gamma_policy, p.gamma, p.gamma_max, greedy || p.coupled_acceptance,
                               config));
    if (p.sigmoid_verify && p.coupled_acceptance)
        return InvalidArgument(
            "the sigmoid verification and the coupled acceptance are two "
            "different tests: choose one");
    if (p.sigmoid_verify && !(p.sigmoid_alpha < 0.0f && p.sigmoid_beta > 0.0f))
        return InvalidArgument("the sigmoid scale needs alpha < 0 < beta");
    if (p.lookup_ngram < 0 || p.lookup_ngram > SPECULA_MAX_LOOKUP_NGRAM)
        return InvalidArgument("lookup_ngram must lie in 0.." +
                               std::to_string(SPECULA_MAX_LOOKUP_NGRAM));
    if (p.lookup_ngram > 0 && p.sigmoid_verify)
        return InvalidArgument(
            "the lookup's drafts are judged exactly: not with the "
            "sigmoid verification");
    config->sampling = {p.temperature, p.top_k, p.top_p, p.seed};
    config->sigmoid_verify = p.sigmoid_verify;
    config->sigmoid_scale = {p.sigmoid_alpha, p.sigmoid_beta};
    config->coupled = p.coupled_acceptance;
    config->lookup_ngram = p.lookup_ngram;
    return Status::Ok();
}

}  // namespace

extern "C" {

const char* specula_last_error(void) {
    return api::last_error().c_str();
}

const char* specula_status_name(specula_status status) {
    switch (status) {
        case SPECULA_OK:
            return "SPECULA_OK";
        case SPECULA_ERR_INVALID_ARGUMENT:
            return "SPECULA_ERR_INVALID_ARGUMENT";
        case SPECULA_ERR_IO:
            return "SPECULA_ERR_IO";
        case SPECULA_ERR_FORMAT:
            return "SPECULA_ERR_FORMAT";
        case SPECULA_ERR_UNSUPPORTED:
            return "SPECULA_ERR_UNSUPPORTED";
        case SPECULA_ERR_OUT_OF_MEMORY:
            return "SPECULA_ERR_OUT_OF_MEMORY";
        case SPECULA_ERR_DEVICE_LOST:
            return "SPECULA_ERR_DEVICE_LOST";
        case SPECULA_ERR_NO_DEVICE:
            return "SPECULA_ERR_NO_DEVICE";
        case SPECULA_ERR_ABORTED:
            return "SPECULA_ERR_ABORTED";
        case SPECULA_ERR_CONTEXT_FULL:
            return "SPECULA_ERR_CONTEXT_FULL";
        case SPECULA_ERR_VOCAB_MISMATCH:
            return "SPECULA_ERR_VOCAB_MISMATCH";
        case SPECULA_ERR_BUFFER_TOO_SMALL:
            return "SPECULA_ERR_BUFFER_TOO_SMALL";
        case SPECULA_ERR_INTERNAL:
            return "SPECULA_ERR_INTERNAL";
    }
    return "SPECULA_ERR_UNKNOWN";
}

#define SPECULA_STRINGIZE(x) #x
#define SPECULA_VERSION_STRING(a, b, c) \
    SPECULA_STRINGIZE(a) "." SPECULA_STRINGIZE(b) "." SPECULA_STRINGIZE(c)

const char* specula_version(void) {
    return SPECULA_VERSION_STRING(SPECULA_VERSION_MAJOR, SPECULA_VERSION_MINOR,
                                  SPECULA_VERSION_PATCH);
}

void specula_set_log_callback(specula_log_fn callback, void* user_data) {
    set_log_sink(callback, user_data);
}

// ------------------------------------------------------------------ backends

namespace {
constexpr std::pair<specula_backend_kind, const char*> kBackendNames[] = {
    {SPECULA_BACKEND_CPU, "cpu"},
    {SPECULA_BACKEND_VULKAN, "vulkan"},
    {SPECULA_BACKEND_CUDA, "cuda"},
    {SPECULA_BACKEND_AUTO, "auto"},
};
}  // namespace

const char* specula_backend_kind_name(specula_backend_kind kind) {
    for (const auto& [k, name] : kBackendNames)
        if (k == kind) return name;
    return "unknown";
}

specula_status specula_backend_kind_from_name(const char* name, specula_backend_kind* kind) {
    return guarded([&] {
        SPECULA_TRY(need(name, "name"));
        SPECULA_TRY(need(kind, "kind"));
        for (const auto& [k, n] : kBackendNames) {
            if (std::strcmp(n, name) == 0) {
                *kind = k;
                return Status::Ok();
            }
        }
        return InvalidArgument(std::string("unknown backend '") + name +
                               "' (cpu, vulkan, cuda, auto)");
    });
}

specula_status specula_gamma_policy_from_name(const char* name, specula_gamma_policy* policy) {
    return guarded([&] {
        SPECULA_TRY(need(name, "name"));
        SPECULA_TRY(need(policy, "policy"));
        constexpr std::pair<specula_gamma_policy, const char*> kNames[] = {
            {SPECULA_GAMMA_FIXED, "fixed"},
            {SPECULA_GAMMA_HEURISTIC, "heuristic"},
            {SPECULA_GAMMA_ANALYTIC, "analytic"},
            {SPECULA_GAMMA_AUTO, "auto"},
        };
        for (const auto& [p, n] : kNames) {
            if (std::strcmp(n, name) == 0) {
                *policy = p;
                return Status::Ok();
            }
        }
        return InvalidArgument(std::string("unknown gamma policy '") + name +
                               "' (fixed, heuristic, analytic, auto)");
    });
}

specula_status specula_device_count(size_t* count) {
    return guarded([&] {
        SPECULA_TRY(need(count, "count"));
        *count = enumerate_devices().size();
        return Status::Ok();
    });
}

specula_status specula_device_get(size_t i, specula_device_info* info) {
    return guarded([&] {
        SPECULA_TRY(need(info, "info"));
        const auto devices = enumerate_devices();
        if (i >= devices.size())
            return InvalidArgument("device index " + std::to_string(i) + " is out of range");
        *info = devices[i];
        return Status::Ok();
    });
}

specula_backend_params specula_backend_default_params(void) {
    specula_backend_params p{};
    p.kind = SPECULA_BACKEND_AUTO;
    p.device_index = -1;
    p.device_name = nullptr;
    p.n_threads = 0;
    return p;
}

void specula_backend_default_params_by_ref(specula_backend_params* params) {
    if (params != nullptr) *params = specula_backend_default_params();
}

specula_status specula_backend_create(const specula_backend_params* params, specula_backend** out) {
    return guarded([&] {
        SPECULA_TRY(need(out, "out"));
        *out = nullptr;
        const specula_backend_params p = params ? *params : specula_backend_default_params();
        if (const int kind = enum_value(p.kind);
            kind != SPECULA_BACKEND_AUTO &&
            (kind < SPECULA_BACKEND_CPU || kind > SPECULA_BACKEND_CUDA))
            return InvalidArgument("unknown backend kind " + std::to_string(kind));
        auto b = std::make_unique<specula_backend>();
        SPECULA_TRY(create_backend(p, &b->impl));
        *out = b.release();
        return Status::Ok();
    });
}

void specula_backend_free(specula_backend* backend) {
    delete backend;
}

specula_status specula_backend_get_info(const specula_backend* backend, specula_device_info* info) {
    return guarded([&] {
        SPECULA_TRY(need(backend, "backend"));
        SPECULA_TRY(need(info, "info"));
        *info = backend->impl->info();
        return Status::Ok();
    });
}

specula_status specula_backend_available_memory(const specula_backend* backend, uint64_t* bytes) {
    return guarded([&] {
        SPECULA_TRY(need(backend, "backend"));
        SPECULA_TRY(need(bytes, "bytes"));
        *bytes = backend->impl->available_memory();
        return Status::Ok();
    });
}

// -------------------------------------------------------------------- models

specula_model_params specula_model_default_params(void) {
    return specula_model_params{};
}

void specula_model_default_params_by_ref(specula_model_params* params) {
    if (params != nullptr) *params = specula_model_default_params();
}

specula_status specula_model_load(specula_backend* backend, const char* path,
                                  const specula_model_params* params, specula_model** out) {
    return guarded([&] {
        SPECULA_TRY(need(out, "out"));
        *out = nullptr;
        SPECULA_TRY(need(backend, "backend"));
        SPECULA_TRY(need(path, "path"));
        const specula_model_params p = params ? *params : specula_model_default_params();
        std::unique_ptr<MappedFile> file;
        SPECULA_TRY(MappedFile::open(path, &file, p.read_into_memory));
        return load_model(backend, std::move(file), p, path, out);
    });
}

specula_status specula_model_load_from_memory(specula_backend* backend, const void* data,
                                              size_t size, const specula_model_params* params,
                                              specula_model** out) {
    return guarded([&] {
        SPECULA_TRY(need(out, "out"));
        *out = nullptr;
        SPECULA_TRY(need(backend, "backend"));
        if (data == nullptr && size > 0) return InvalidArgument("data is NULL");
        const specula_model_params p = params ? *params : specula_model_default_params();
        return load_model(backend,
                          MappedFile::copy_of(std::span(static_cast<const uint8_t*>(data), size)),
                          p, "model in memory", out);
    });
}

void specula_model_free(specula_model* model) {
    if (model == nullptr) return;
    std::lock_guard turn(model->backend->turn);
    delete model;
}

specula_status specula_model_get_info(const specula_model* model, specula_model_info* info) {
    return guarded([&] {
        SPECULA_TRY(need(model, "model"));
        SPECULA_TRY(need(info, "info"));
        const LlamaModel& m = *model->impl;
        const LlamaConfig& c = m.config();
        *info = specula_model_info{};
        copy_string(info->architecture, c.architecture.c_str());
        copy_string(info->name, m.name());
        copy_string(info->tokenizer, m.tokenizer().kind_name());
        info->n_vocab = c.n_vocab;
        info->n_ctx_train = c.n_ctx_train;
        info->n_embd = c.n_embd;
        info->n_layer = c.n_layer;
        info->n_head = c.n_head;
        info->n_head_kv = c.n_head_kv;
        info->n_ff = c.n_ff;
        info->bos_token = m.tokenizer().bos();
        info->eos_token = m.tokenizer().eos();
        info->n_params = m.n_params();
        info->weight_bytes = m.weight_bytes();
        static_assert(SPECULA_WEIGHT_Q4_1 == int(GgmlType::kQ4_1) &&
                      SPECULA_WEIGHT_Q5_0 == int(GgmlType::kQ5_0) &&
                      SPECULA_WEIGHT_Q5_1 == int(GgmlType::kQ5_1) &&
                      SPECULA_WEIGHT_Q8_0 == int(GgmlType::kQ8_0) &&
                      SPECULA_WEIGHT_Q4_K == int(GgmlType::kQ4_K) &&
                      SPECULA_WEIGHT_Q6_K == int(GgmlType::kQ6_K));  // GGUF's numbering
        info->weight_type = specula_weight_type(m.dominant_weight_type());
        return Status::Ok();
    });
}

// ----------------------------------------------------------------- tokenizer

specula_status specula_tokenize(const specula_model* model, const char* text, size_t len,
                                uint32_t flags, int32_t* tokens, size_t capacity,
                                size_t* n_tokens) {
    return guarded([&] {
        SPECULA_TRY(need(model, "model"));
        SPECULA_TRY(need(n_tokens, "n_tokens"));
        if (text == nullptr && len > 0) return InvalidArgument("text is NULL");
        if (tokens == nullptr && capacity > 0) return InvalidArgument("tokens is NULL");
        if ((flags & ~uint32_t(SPECULA_TOKENIZE_ADD_BOS | SPECULA_TOKENIZE_PARSE_SPECIAL)) != 0)
            return InvalidArgument("unknown tokenize flags " + std::to_string(flags));
        const auto ids = model->impl->tokenizer().encode(
            std::string_view(text ? text : "", len), (flags & SPECULA_TOKENIZE_ADD_BOS) != 0,
            (flags & SPECULA_TOKENIZE_PARSE_SPECIAL) != 0);
        *n_tokens = ids.size();
        if (ids.size() > capacity)
            return Status(SPECULA_ERR_BUFFER_TOO_SMALL,
                          "the text needs " + std::to_string(ids.size()) + " tokens");
        std::copy(ids.begin(), ids.end(), tokens);
        return Status::Ok();
    });
}

specula_status specula_detokenize(const specula_model* model, const int32_t* tokens,
                                  size_t n_tokens, char* text, size_t capacity, size_t* length) {
    return guarded([&] {
        SPECULA_TRY(need(model, "model"));
        SPECULA_TRY(need(length, "length"));
        if (tokens == nullptr && n_tokens > 0) return InvalidArgument("tokens is NULL");
        if (text == nullptr && capacity > 0) return InvalidArgument("text is NULL");
        const Tokenizer& tok = model->impl->tokenizer();
        for (size_t i = 0; i < n_tokens; ++i)
            if (tokens[i] < 0 || tokens[i] >= tok.n_vocab())
                return InvalidArgument("token id " + std::to_string(tokens[i]) +
                                       " is outside the vocabulary");
        const std::string s = tok.decode(std::span(tokens, n_tokens));
        return copy_bytes_out(s, text, capacity, length);
    });
}

specula_status specula_token_text(const specula_model* model, int32_t token, char* text,
                                  size_t capacity, size_t* length) {
    return guarded([&] {
        SPECULA_TRY(need(model, "model"));
        SPECULA_TRY(need(length, "length"));
        if (text == nullptr && capacity > 0) return InvalidArgument("text is NULL");
        const Tokenizer& tok = model->impl->tokenizer();
        if (token < 0 || token >= tok.n_vocab())
            return InvalidArgument("token id " + std::to_string(token) +
                                   " is outside the vocabulary");
        const std::string s = tok.text_of(token);
        return copy_bytes_out(s, text, capacity, length);
    });
}

bool specula_token_ends_generation(const specula_model* model, int32_t token) {
    return model != nullptr && model->impl->tokenizer().ends_generation(token);
}

// ---------------------------------------------------------------------- chat

specula_status specula_chat_apply_template(const specula_model* model, const char* tmpl,
                                           const specula_chat_message* messages, size_t n_messages,
                                           bool add_generation_prompt, char* text, size_t capacity,
                                           size_t* length) {
    return guarded([&] {
        SPECULA_TRY(need(model, "model"));
        SPECULA_TRY(need(length, "length"));
        if (messages == nullptr && n_messages > 0) return InvalidArgument("messages is NULL");
        if (text == nullptr && capacity > 0) return InvalidArgument("text is NULL");
        const Tokenizer& tok = model->impl->tokenizer();
        if (tmpl == nullptr && tok.chat_template().empty())
            return Status(SPECULA_ERR_UNSUPPORTED, "the model has no tokenizer.chat_template");
        ChatTemplate chat;
        SPECULA_TRY(ChatTemplate::from(tmpl != nullptr ? tmpl : tok.chat_template(), &chat));
        std::vector<ChatMessage> list(n_messages);
        for (size_t i = 0; i < n_messages; ++i) {
            if (messages[i].role == nullptr || messages[i].content == nullptr)
                return InvalidArgument("message " + std::to_string(i) +
                                       " has a NULL role or content");
            list[i] = {messages[i].role, messages[i].content};
        }
        std::string s;
        SPECULA_TRY(chat.apply(list, add_generation_prompt, tok.text_of(tok.bos()),
                               tok.text_of(tok.eos()), &s));
        return copy_bytes_out(s, text, capacity, length);
    });
}

// ------------------------------------------------------------------ sessions

specula_session_params specula_session_default_params(void) {
    specula_session_params p{};
    p.n_ctx = 0;
    p.seed = 0x5eed;
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.draft = nullptr;
    p.gamma_policy = SPECULA_GAMMA_AUTO;
    p.gamma = 5;
    p.gamma_max = 8;
    p.sigmoid_verify = false;
    p.sigmoid_alpha = -1000.0f;
    p.sigmoid_beta = 1000.0f;
    p.coupled_acceptance = true;
    p.lookup_ngram = 0;
    return p;
}

void specula_session_default_params_by_ref(specula_session_params* params) {
    if (params != nullptr) *params = specula_session_default_params();
}

specula_generate_params specula_generate_default_params(void) {
    specula_generate_params p{};
    p.max_tokens = 128;
    p.stop_at_eos = true;
    return p;
}

void specula_generate_default_params_by_ref(specula_generate_params* params) {
    if (params != nullptr) *params = specula_generate_default_params();
}

specula_status specula_session_create(specula_model* model, const specula_session_params* params,
                                      specula_session** out) {
    return guarded([&] {
        SPECULA_TRY(need(out, "out"));
        *out = nullptr;
        SPECULA_TRY(need(model, "model"));
        const specula_session_params p = params ? *params : specula_session_default_params();
        Generator::Config config;
        SPECULA_TRY(generator_config(p, &config));
        std::lock_guard turn(model->backend->turn);
        auto s = std::make_unique<specula_session>();
        s->model = model;
        s->params = p;
        const int64_t n_ctx = p.n_ctx > 0 ? int64_t(p.n_ctx) : model->impl->config().n_ctx_train;
        constexpr int kMaxBatch = 64;
        SPECULA_TRY(LlamaContext::create(*model->impl, n_ctx, kMaxBatch, &s->target));
        if (p.draft != nullptr) {
            const LlamaModel& draft = *p.draft->impl;
            if (&draft.backend() != &model->impl->backend())
                return InvalidArgument("the draft model must be loaded on the target's backend");
            SPECULA_TRY(model->impl->tokenizer().check_draft(draft.tokenizer()));
            SPECULA_TRY(LlamaContext::create(draft, n_ctx, kMaxBatch, &s->draft));
        }
        s->draft_serial = p.draft != nullptr ? p.draft->serial : 0;
        s->measurements = model->measured_with[s->draft_serial];
        s->measurements.forget_realized();
        s->generator =
            std::make_unique<Generator>(*s->target, s->draft.get(), config, &s->measurements);
        *out = s.release();
        return Status::Ok();
    });
}

specula_status specula_session_set_sampling(specula_session* session, float temperature,
                                            int32_t top_k, float top_p, uint64_t seed) {
    return guarded([&] {
        SPECULA_TRY(need(session, "session"));
        specula_session_params p = session->params;
        p.temperature = temperature;
        p.top_k = top_k;
        p.top_p = top_p;
        p.seed = seed;
        Generator::Config config;
        SPECULA_TRY(generator_config(p, &config));  // refused: the session is as it was
        std::lock_guard turn(session->model->backend->turn);
        session->generator->reset();  // empties both contexts, as a new generator needs
        session->generator = std::make_unique<Generator>(*session->target, session->draft.get(),
                                                         config, &session->measurements);
        session->params = p;
        session->unreported.clear();
        session->stats = specula_session_stats{};
        return Status::Ok();
    });
}

void specula_session_free(specula_session* session) {
    if (session == nullptr) return;
    std::lock_guard turn(session->model->backend->turn);
    session->model->measured_with[session->draft_serial] = session->measurements;
    delete session;
}

specula_status specula_session_reset(specula_session* session) {
    return guarded([&] {
        SPECULA_TRY(need(session, "session"));
        session->generator->reset();
        session->measurements.forget_realized();
        session->unreported.clear();
        session->stats = specula_session_stats{};
        return Status::Ok();
    });
}

specula_status specula_session_eval(specula_session* session, const int32_t* tokens,
                                    size_t n_tokens) {
    return guarded([&] {
        SPECULA_TRY(need(session, "session"));
        if (tokens == nullptr && n_tokens > 0) return InvalidArgument("tokens is NULL");
        const int n_vocab = session->model->impl->config().n_vocab;
        for (size_t i = 0; i < n_tokens; ++i)
            if (tokens[i] < 0 || tokens[i] >= n_vocab)
                return InvalidArgument("token id " + std::to_string(tokens[i]) +
                                       " is outside the vocabulary");
        if (session->generator->committed().size() + n_tokens > size_t(session->target->n_ctx()))
            return Status(SPECULA_ERR_CONTEXT_FULL, "the prompt does not fit the context of " +
                                                        std::to_string(session->target->n_ctx()) +
                                                        " tokens");
        const auto t0 = Clock::now();
        Status s = counted(session, [&] {
            forget_unreported(*session);
            return session->generator->append(std::span(tokens, n_tokens));
        });
        session->stats.n_prompt_tokens += n_tokens;
        session->stats.prompt_seconds += seconds_since(t0);
        return s;
    });
}

specula_status specula_session_get_logits(specula_session* session, float* logits,
                                          size_t capacity) {
    return guarded([&] {
        SPECULA_TRY(need(session, "session"));
        SPECULA_TRY(need(logits, "logits"));
        const size_t n_vocab = size_t(session->model->impl->config().n_vocab);
        if (capacity < n_vocab)
            return Status(SPECULA_ERR_BUFFER_TOO_SMALL,
                          "logits need " + std::to_string(n_vocab) + " floats");
        std::vector<float> row;
        SPECULA_TRY(counted(session, [&] {
            forget_unreported(*session);
            return session->generator->last_logits(&row);
        }));
        std::copy(row.begin(), row.end(), logits);
        return Status::Ok();
    });
}

specula_status specula_generate(specula_session* session, const specula_generate_params* params,
                                int32_t* tokens, size_t capacity, size_t* n_generated) {
    size_t count = 0;
    const specula_status status = guarded([&] {
        SPECULA_TRY(need(session, "session"));
        if (tokens == nullptr && capacity > 0) return InvalidArgument("tokens is NULL");
        const specula_generate_params g = params ? *params : specula_generate_default_params();
        if (g.max_tokens < 0) return InvalidArgument("max_tokens is negative");
        specula_session& s = *session;
        const auto t0 = Clock::now();
        struct Timer {  // charges the time to the stats however the loop ends
            specula_session& s;
            Clock::time_point t0;
            ~Timer() { s.stats.generate_seconds += seconds_since(t0); }
        } timer{s, t0};
        const Tokenizer& tok = s.model->impl->tokenizer();
        struct Generating {  // counted for StepQueue's gathering however the loop ends
            StepQueue& q;
            explicit Generating(StepQueue& queue) : q(queue) {
                std::lock_guard lock(q.mutex);
                ++q.generating;
            }
            ~Generating() {
                std::lock_guard lock(q.mutex);
                --q.generating;
                q.woken.notify_all();
            }
        } generating{s.model->steps};
        std::vector<int32_t> step_tokens = std::exchange(s.unreported, {});
        bool from_unreported = !step_tokens.empty();
        // Generation ends before step_tokens[after]: the rest stays committed, reported next time.
        auto end_before = [&](size_t after) {
            s.unreported.assign(step_tokens.begin() + std::ptrdiff_t(after), step_tokens.end());
            return Status::Ok();
        };
        while (count < size_t(g.max_tokens)) {
            if (!from_unreported) {
                if (g.should_abort != nullptr && g.should_abort(g.should_abort_user_data))
                    return Status(SPECULA_ERR_ABORTED,
                                  "generation was aborted by the abort callback");
                step_tokens.clear();
                SPECULA_TRY(step_together(session, g.max_tokens - int(count), &step_tokens));
            }
            from_unreported = false;
            for (size_t i = 0; i < step_tokens.size(); ++i) {
                const int32_t t = step_tokens[i];
                // The end of the reply itself is not reported; the session's context keeps it.
                if (g.stop_at_eos && tok.ends_generation(t)) return end_before(i + 1);
                if (count == size_t(g.max_tokens)) return end_before(i);
                if (count < capacity) tokens[count] = t;
                ++count;
                ++s.stats.n_generated;
                if (g.on_token != nullptr) {
                    const std::string piece = tok.piece(t);
                    if (!g.on_token(t, piece.data(), piece.size(), g.on_token_user_data))
                        return end_before(i + 1);
                }
            }
        }
        return Status::Ok();
    });
    if (n_generated != nullptr) *n_generated = count;
    return status;
}

specula_status specula_session_memory(const specula_session* session, uint64_t* target_bytes,
                                      uint64_t* draft_bytes) {
    return guarded([&] {
        SPECULA_TRY(need(session, "session"));
        SPECULA_TRY(need(target_bytes, "target_bytes"));
        SPECULA_TRY(need(draft_bytes, "draft_bytes"));
        *target_bytes = session->target->memory_bytes();
        *draft_bytes = session->draft ? session->draft->memory_bytes() : 0;
        return Status::Ok();
    });
}

specula_status specula_session_get_stats(const specula_session* session,
                                         specula_session_stats* stats) {
    return guarded([&] {
        SPECULA_TRY(need(session, "session"));
        SPECULA_TRY(need(stats, "stats"));
        *stats = session->stats;
        const GeneratorStats& g = session->generator->stats();
        stats->n_past = uint32_t(session->target->n_past());
        stats->n_forward_calls = session->target->forward_calls();
        stats->n_steps = g.steps;
        stats->n_drafted = g.drafted;
        stats->n_accepted = g.accepted;
        stats->n_evaluated = g.evaluated;
        stats->acceptance_rate = g.evaluated > 0 ? double(g.accepted) / double(g.evaluated) : 0.0;
        stats->tokens_per_step = g.steps > 0 ? double(g.emitted) / double(g.steps) : 0.0;
        for (int i = 0; i < SPECULA_MAX_GAMMA; ++i) {
            stats->evaluated_at[i] = g.evaluated_at[size_t(i)];
            stats->accepted_at[i] = g.accepted_at[size_t(i)];
        }
        stats->draft_seconds = g.draft_seconds;
        stats->target_seconds = g.target_seconds;
        stats->verify_seconds = g.verify_seconds;
        stats->last_gamma = g.last_gamma;
        stats->n_lookup_drafted = g.lookup_drafted;
        stats->n_lookup_accepted = g.lookup_accepted;
        return Status::Ok();
    });
}

}  // extern "C"
