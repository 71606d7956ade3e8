/*
 * specula — a small inference runtime for quantized target/draft model pairs.
 *
 * This is the only public header. Conventions:
 *   - Opaque handles with create/free pairs. Free functions accept NULL.
 *   - Every call that can fail returns a specula_status; SPECULA_OK is 0.
 *     specula_last_error() returns a message for the last failure on the
 *     calling thread. The library never aborts on bad input, bad files,
 *     out-of-memory or device loss.
 *   - Parameter structs come from specula_*_default_params(); the _by_ref
 *     variants fill a caller-owned struct, for FFI bindings that cannot
 *     receive structs by value.
 *   - A model may be shared by several sessions; a session is used by one
 *     thread at a time. Sessions on one backend may be used from several
 *     threads at once: their calls take turns on the backend (one evaluation
 *     or generation step at a time). Generation steps that sessions of one
 *     model ask for at the same time run together: one plain step each (no
 *     drafts), in one forward pass for up to 17 sessions, which on a
 *     memory-bound device costs little more than one session's step. Each
 *     session's output is what it would generate alone.
 */
#ifndef SPECULA_H
#define SPECULA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(SPECULA_BUILDING_SHARED)
#define SPECULA_API __declspec(dllexport)
#elif defined(__GNUC__)
#define SPECULA_API __attribute__((visibility("default")))
#else
#define SPECULA_API
#endif

#define SPECULA_VERSION_MAJOR 0
#define SPECULA_VERSION_MINOR 1
#define SPECULA_VERSION_PATCH 0

/* ---------------------------------------------------------------- status */

typedef enum specula_status {
    SPECULA_OK = 0,
    SPECULA_ERR_INVALID_ARGUMENT = 1, /* a NULL handle, an out-of-range value */
    SPECULA_ERR_IO = 2,               /* a file could not be opened or mapped */
    SPECULA_ERR_FORMAT = 3,           /* a malformed or truncated file */
    SPECULA_ERR_UNSUPPORTED = 4,      /* a valid file using a feature specula lacks */
    SPECULA_ERR_OUT_OF_MEMORY = 5,    /* host or device memory exhausted */
    SPECULA_ERR_DEVICE_LOST = 6,      /* the GPU was lost; recreate the backend */
    SPECULA_ERR_NO_DEVICE = 7,        /* the requested backend or device is absent */
    SPECULA_ERR_ABORTED = 8,          /* the abort or progress callback asked to stop */
    SPECULA_ERR_CONTEXT_FULL = 9,     /* the session's context length is exhausted */
    SPECULA_ERR_VOCAB_MISMATCH = 10,  /* draft and target tokenizers differ */
    SPECULA_ERR_BUFFER_TOO_SMALL =
        11, /* the required size is reported through the size out-param */
    SPECULA_ERR_INTERNAL = 12
} specula_status;

/* Message for the last error on this thread; never NULL, "" when none. */
SPECULA_API const char* specula_last_error(void);
/* Short name of a status code, e.g. "SPECULA_ERR_FORMAT". */
SPECULA_API const char* specula_status_name(specula_status status);
SPECULA_API const char* specula_version(void);

/* ------------------------------------------------------------------- log */

typedef enum specula_log_level {
    SPECULA_LOG_DEBUG = 0,
    SPECULA_LOG_INFO = 1,
    SPECULA_LOG_WARN = 2,
    SPECULA_LOG_ERROR = 3
} specula_log_level;

typedef void (*specula_log_fn)(specula_log_level level, const char* message, void* user_data);

/* Process-wide log sink. NULL restores the default (warnings and errors to stderr). */
SPECULA_API void specula_set_log_callback(specula_log_fn callback, void* user_data);

/* --------------------------------------------------------------- backends */

typedef enum specula_backend_kind {
    SPECULA_BACKEND_CPU = 0,
    SPECULA_BACKEND_VULKAN = 1,
    SPECULA_BACKEND_CUDA = 2,
    SPECULA_BACKEND_AUTO = 100 /* the best available: CUDA, then a Vulkan GPU (discrete first),
                                  then cpu; software Vulkan devices are not chosen */
} specula_backend_kind;

/* "cpu", "vulkan", "cuda", "auto" <-> the kinds: one spelling for every front end. */
SPECULA_API const char* specula_backend_kind_name(specula_backend_kind kind);
SPECULA_API specula_status specula_backend_kind_from_name(const char* name,
                                                          specula_backend_kind* kind);

typedef struct specula_device_info {
    specula_backend_kind kind;
    int32_t index; /* index within its kind, as accepted by specula_backend_params */
    char name[256];
    bool is_discrete_gpu;
    bool is_software;      /* e.g. llvmpipe */
    uint64_t memory_bytes; /* device-local memory, 0 when unknown */
} specula_device_info;

/* Enumerates every device of every compiled-in backend (the cpu is always device 0). */
SPECULA_API specula_status specula_device_count(size_t* count);
SPECULA_API specula_status specula_device_get(size_t i, specula_device_info* info);

/* A computation path a backend may take: its own choice for the device, or forced on or off. */
typedef enum specula_path {
    SPECULA_PATH_AUTO = 0,
    SPECULA_PATH_ON = 1,
    SPECULA_PATH_OFF = 2
} specula_path;

/* How a backend computes (specula_backend_params.options). All zero, as
 * specula_backend_default_params gives it, is each backend's own choice for its device: what an
 * app wants. The paths are for benchmarks that compare them and for tests. Every path gives the
 * same tokens as the others (each is tested against them), except int8_inputs, which rounds a
 * quantized matmul's inputs to 8 bits as llama.cpp does. Each field names the backends that
 * read it; the others ignore it. The environment variables of docs/PROGRAMS.md ("Backend
 * options") fill the fields an app leaves AUTO, false or 0. */
typedef struct specula_backend_options {
    specula_path int8_inputs;   /* cpu (default on), CUDA (default on for Q8_0 and Q4_0): quantized
                                   weights times 8-bit inputs by integer dot products */
    specula_path tiled;         /* Vulkan, CUDA: the tiled matmul for wide batches (default: on
                                   GPUs, not on software Vulkan devices) */
    specula_path fused_norm;    /* Vulkan: matmuls apply their input's RMS norm (default: on
                                   GPUs) */
    specula_path fused_rope;    /* Vulkan, CUDA: the q and k matmuls rotate their outputs
                                   (default on) */
    specula_path fused_gate;    /* CUDA: the feed-forward's two products and its gate in one
                                   kernel (default on; Vulkan fuses them always) */
    specula_path subgroups;     /* Vulkan: subgroup sums where the device has shuffles (default
                                   on; off: the shared-memory sums) */
    specula_path pin_subgroup;  /* Vulkan: the matmuls' subgroup size pinned (default: where the
                                   driver may pick several sizes) */
    specula_path small_storage; /* Vulkan: weights read through 8/16-bit storage (default: on
                                   GPUs that have it) */
    specula_path staged;        /* CUDA: a warp stages the weights through shared memory
                                   (default on) */
    specula_path tensor_cores;  /* CUDA: Q8_0 and Q4_0 batches by tensor cores, sm_80 and later
                                   (default off) */
    specula_path split_attention; /* CUDA: a long context's attention split over blocks (default
                                     on) */
    specula_path host_rules;      /* CUDA: mask programs (Whisper's rules) on the host (default
                                     off) */
    specula_path amx;             /* cpu: batches of 16 inputs and more by AMX tile multiplies
                                     (default: where the CPU and the system have them) */
    bool barrier_every_dispatch;  /* Vulkan: a barrier after every dispatch (a baseline) */
    bool profile;                 /* cpu, Vulkan: each op timed, the table written to stderr
                                     when the backend is freed */
    uint64_t max_binding_bytes;   /* Vulkan: bind at most this much of a buffer at once (0: the
                                     device's storage-buffer range) */
} specula_backend_options;

typedef struct specula_backend_params {
    specula_backend_kind kind;
    int32_t device_index;    /* within the kind; -1 selects by name or the best one */
    const char* device_name; /* optional substring match; NULL for none */
    int32_t n_threads;       /* cpu backend; 0 = all hardware threads, and at most those */
    specula_backend_options options;
} specula_backend_params;

typedef struct specula_backend specula_backend;

SPECULA_API specula_backend_params specula_backend_default_params(void);
SPECULA_API void specula_backend_default_params_by_ref(specula_backend_params* params);
/* Opens a device; the caller owns *out (specula_backend_free, after every model on it is freed).
 * SPECULA_ERR_NO_DEVICE: the kind is not compiled in, or no device of it (or of that index or
 * name) is present; SPECULA_ERR_INVALID_ARGUMENT: parameters out of range. */
SPECULA_API specula_status specula_backend_create(const specula_backend_params* params,
                                                  specula_backend** out);
SPECULA_API void specula_backend_free(specula_backend* backend);
SPECULA_API specula_status specula_backend_get_info(const specula_backend* backend,
                                                    specula_device_info* info);
/* What the backend can still allocate: free device-local memory on a GPU, the system's
 * available memory for the cpu backend; 0 when unknown. With specula_model_info.weight_bytes
 * and specula_session_memory an app can tell whether a target/draft pair fits; a load or a
 * session that does not fit fails with SPECULA_ERR_OUT_OF_MEMORY before allocating. */
SPECULA_API specula_status specula_backend_available_memory(const specula_backend* backend,
                                                            uint64_t* bytes);

/* ----------------------------------------------------------------- models */

typedef enum specula_weight_type {
    SPECULA_WEIGHT_F32 = 0, /* values match GGUF's ggml_type numbering */
    SPECULA_WEIGHT_F16 = 1,
    SPECULA_WEIGHT_Q4_0 = 2,
    SPECULA_WEIGHT_Q4_1 = 3,
    SPECULA_WEIGHT_Q5_0 = 6,
    SPECULA_WEIGHT_Q5_1 = 7,
    SPECULA_WEIGHT_Q8_0 = 8,
    SPECULA_WEIGHT_Q4_K = 12,
    SPECULA_WEIGHT_Q5_K = 13,
    SPECULA_WEIGHT_Q6_K = 14
} specula_weight_type;

/* Called during loading with progress in [0, 1]; return false to cancel (SPECULA_ERR_ABORTED). */
typedef bool (*specula_progress_fn)(float progress, void* user_data);

typedef struct specula_model_params {
    specula_progress_fn progress;
    void* progress_user_data;
    /* The file is memory-mapped and the cpu backend reads weights from the mapping: if the
     * file is truncated or rewritten while the model is loaded, the process gets SIGBUS (as
     * with SQLite's and llama.cpp's mmap). Apps that cannot guarantee the file set this to
     * read it into memory instead (costs a copy of the file in RAM). */
    bool read_into_memory;
} specula_model_params;

typedef struct specula_model_info {
    char architecture[32]; /* "llama" */
    char name[128];        /* general.name, "" when absent */
    char tokenizer[16];    /* "llama" (SentencePiece) or "gpt2" (byte-level BPE) */
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t n_ff;
    int32_t bos_token; /* -1 when none */
    int32_t eos_token; /* -1 when none */
    uint64_t n_params;
    uint64_t weight_bytes;
    specula_weight_type weight_type; /* the type holding most weight bytes */
} specula_model_info;

typedef struct specula_model specula_model;

SPECULA_API specula_model_params specula_model_default_params(void);
SPECULA_API void specula_model_default_params_by_ref(specula_model_params* params);
/* Memory-maps (or reads, see read_into_memory) a GGUF file and places its weights on the
 * backend. Only regular files are opened. The caller owns *out (specula_model_free); the backend
 * must outlive the model. SPECULA_ERR_IO: the file cannot be opened or mapped;
 * SPECULA_ERR_FORMAT: malformed or truncated; SPECULA_ERR_UNSUPPORTED: an architecture,
 * tokenizer or tensor type specula lacks (named in the message); SPECULA_ERR_OUT_OF_MEMORY;
 * SPECULA_ERR_ABORTED: the progress callback returned false. */
SPECULA_API specula_status specula_model_load(specula_backend* backend, const char* path,
                                              const specula_model_params* params,
                                              specula_model** out);
/* The same from a GGUF file's bytes in memory (an app's asset, a download): they are copied,
 * so the caller may free them when this returns. */
SPECULA_API specula_status specula_model_load_from_memory(specula_backend* backend,
                                                          const void* data, size_t size,
                                                          const specula_model_params* params,
                                                          specula_model** out);
SPECULA_API void specula_model_free(specula_model* model);
SPECULA_API specula_status specula_model_get_info(const specula_model* model,
                                                  specula_model_info* info);

/* ------------------------------------------------------------- tokenizer */

/* specula_tokenize's flags (true and false still mean "add BOS" and nothing). */
enum {
    SPECULA_TOKENIZE_ADD_BOS = 1,      /* the model's BOS first, where it has one */
    SPECULA_TOKENIZE_PARSE_SPECIAL = 2 /* control tokens written in the text (<|im_start|>)
                                        * are those tokens, as chat templates need; without
                                        * this flag they are text like any other */
};
/* Tokenizes `len` bytes of UTF-8. When `capacity` is too small the call
 * returns SPECULA_ERR_BUFFER_TOO_SMALL and *n_tokens holds the count needed. */
SPECULA_API specula_status specula_tokenize(const specula_model* model, const char* text,
                                            size_t len, uint32_t flags, int32_t* tokens,
                                            size_t capacity, size_t* n_tokens);
/* Concatenated bytes of the tokens' pieces (control tokens produce nothing).
 * Writes no terminator; *length is the byte count (needed size on BUFFER_TOO_SMALL). */
SPECULA_API specula_status specula_detokenize(const specula_model* model, const int32_t* tokens,
                                              size_t n_tokens, char* text, size_t capacity,
                                              size_t* length);

/* A token's text as the vocabulary and chat templates write it: a control token's own text
 * ("<|im_end|>", which specula_detokenize leaves out), any other token's bytes. Writes no
 * terminator; *length as in specula_detokenize. */
SPECULA_API specula_status specula_token_text(const specula_model* model, int32_t token, char* text,
                                              size_t capacity, size_t* length);
/* Whether a token ends a reply (what specula_generate's stop_at_eos stops at): EOS, the
 * end-of-turn ids the file names, and the end-of-turn tokens of the chat formats. */
SPECULA_API bool specula_token_ends_generation(const specula_model* model, int32_t token);

/* ------------------------------------------------------------------- chat */

typedef struct specula_chat_message {
    const char* role; /* "system", "user", "assistant" (and what the template knows) */
    const char* content;
} specula_chat_message;

/* Writes a conversation as the model's chat template (tokenizer.chat_template) writes it, for
 * the families of docs/DESIGN.md "Chat": Llama 3 (3.1 and 3.2 included), ChatML (Qwen2.5,
 * Qwen3), Gemma, Mistral v3-tekken (Mistral Nemo), Phi-3. A template of another family, or a
 * model without one, is SPECULA_ERR_UNSUPPORTED; a conversation the template refuses (roles
 * that do not alternate where it requires it) is SPECULA_ERR_INVALID_ARGUMENT. `tmpl` (may be
 * NULL) replaces the model's: a Jinja template or a family's name ("llama3", "chatml",
 * "gemma", "mistral-v3-tekken", "phi3"). The text holds the BOS where the template writes
 * it: tokenize it with SPECULA_TOKENIZE_PARSE_SPECIAL alone (as Hugging Face's
 * apply_chat_template output is tokenized). Writes no terminator; *length is the byte count
 * (needed size on BUFFER_TOO_SMALL). */
SPECULA_API specula_status specula_chat_apply_template(const specula_model* model, const char* tmpl,
                                                       const specula_chat_message* messages,
                                                       size_t n_messages,
                                                       bool add_generation_prompt, char* text,
                                                       size_t capacity, size_t* length);

/* --------------------------------------------------------------- sessions */

typedef enum specula_gamma_policy {
    SPECULA_GAMMA_FIXED = 0, /* always `gamma` drafts per step */
    SPECULA_GAMMA_HEURISTIC =
        1, /* start at `gamma`; +2 after a fully accepted step, -1 otherwise */
    /* The γ with the most expected tokens per second (Leviathan et al. Thm 3.8 with the
     * measured α, draft cost and target cost per number of positions), 0 included: plain
     * decoding where no γ pays or where steps with drafts realized less than plain steps, with
     * a probe of drafts now and then to keep measuring (docs/DESIGN.md "Speculative decoding").
     * What it measured is kept across specula_session_reset. The output does not depend on γ
     * (greedy, or sampled with coupled_acceptance); with Leviathan et al.'s test it does. */
    SPECULA_GAMMA_ANALYTIC = 2,
    /* The default: analytic where the output does not depend on γ (greedy, or sampled with
     * coupled_acceptance: it is the target alone's), heuristic where it does (sampling with
     * Leviathan et al.'s test), so that a sampled output stays reproducible from the seed.
     * Speech: always analytic (its sampled attempts use the coupled acceptance). */
    SPECULA_GAMMA_AUTO = 3
} specula_gamma_policy;

/* "fixed", "heuristic", "analytic", "auto" -> the policies: one spelling for every front end. */
SPECULA_API specula_status specula_gamma_policy_from_name(const char* name,
                                                          specula_gamma_policy* policy);

/* Temperatures below this sample greedily (docs/DESIGN.md "Sampling and random numbers"). */
#define SPECULA_MIN_TEMPERATURE 1e-6f

typedef struct specula_session_params {
    uint32_t n_ctx;    /* context length; 0 = the model's training context (within its sliding
                        * window, where it has one: a longer context is SPECULA_ERR_UNSUPPORTED).
                        * More than the backend can hold: SPECULA_ERR_OUT_OF_MEMORY before
                        * anything is allocated; beyond the training context: a warning in the
                        * log */
    uint64_t seed;     /* the Philox key: same seed + same logits = same tokens on every backend */
    float temperature; /* 0 = greedy; so is anything below SPECULA_MIN_TEMPERATURE */
    int32_t top_k;     /* 0 = off */
    float top_p;       /* 1 = off */
    /* Speculative decoding: a draft model on the same backend whose token ids mean what
     * the target's do: the same tokenizer kind, BOS, EOS and add-BOS, the same token texts
     * over the ids both have, and at most 128 ids more on either side, all unused (padding,
     * as GGUF conversions pad a vocabulary); else SPECULA_ERR_VOCAB_MISMATCH naming the first
     * difference. NULL decodes with the target alone. The output distribution is the
     * target's either way. */
    specula_model* draft;
    specula_gamma_policy gamma_policy; /* default SPECULA_GAMMA_AUTO */
    int32_t gamma;     /* drafts per step (fixed), or the starting value (1..SPECULA_MAX_GAMMA) */
    int32_t gamma_max; /* upper bound of the adaptive policies (1..SPECULA_MAX_GAMMA) */
    /* Opt-in, NOT exact: the sigmoid approximation of Wagner et al. (2024) in the
     * acceptance test and the residual. The output then no longer follows the target's
     * distribution (docs/DESIGN.md has measurements). */
    bool sigmoid_verify;
    float sigmoid_alpha; /* < 0; default -1000 */
    float sigmoid_beta;  /* > 0; default 1000 */
    /* true (the default): the coupled acceptance. Each draft is drawn with the noise the target
     * draws with at its position and accepted while the target's own draw there agrees, so the
     * output is exactly what the target alone generates with the same seed, whatever the draft
     * and γ (and SPECULA_GAMMA_AUTO follows measured costs when sampling too). false: Leviathan
     * et al.'s test and residual resampling, which accepts more often (α = Σ min(p, q)) but whose
     * sampled output depends on the draft and on γ. Greedy decoding is the same either way. false
     * with sigmoid_verify. */
    bool coupled_acceptance;
    /* Model-free drafts (prompt lookup): where the last tokens of the context occurred before,
     * in the prompt or in what was generated, the tokens that followed them are proposed as
     * drafts and judged by the target as any draft is, so the output stays the target's. Text
     * that repeats its context (code being edited, a document quoted or summarised) gains; 0
     * (the default) is off, 1..SPECULA_MAX_LOOKUP_NGRAM the longest suffix looked up. With a
     * draft model too, a step takes the lookup's drafts where it has some that the γ policy
     * expects to pay more than the model's. Sampled lookup drafts are judged by the coupled
     * test whatever coupled_acceptance says (a proposal is one token: both tests accept it
     * with the target's probability of it). Not with sigmoid_verify. */
    int32_t lookup_ngram;
} specula_session_params;

/* Streams each generated token; `piece` holds its bytes (a UTF-8 character
 * may be split across tokens). Return false to stop generating. */
typedef bool (*specula_token_fn)(int32_t token, const char* piece, size_t piece_len,
                                 void* user_data);
/* Polled between forward passes; return true to abort with SPECULA_ERR_ABORTED. */
typedef bool (*specula_abort_fn)(void* user_data);

typedef struct specula_generate_params {
    int32_t max_tokens;
    bool stop_at_eos; /* stop at a token that ends a reply: EOS, and the end-of-turn tokens of
                       * the chat formats (<|eot_id|>, <|im_end|>, <end_of_turn>, ...) */
    specula_token_fn on_token;
    void* on_token_user_data;
    specula_abort_fn should_abort;
    void* should_abort_user_data;
} specula_generate_params;

#define SPECULA_MAX_GAMMA 16
#define SPECULA_MAX_LOOKUP_NGRAM 8

typedef struct specula_session_stats {
    uint32_t n_past;          /* tokens in the context */
    uint64_t n_prompt_tokens; /* evaluated through specula_session_eval */
    uint64_t n_generated;     /* produced by specula_generate */
    uint64_t n_forward_calls; /* forward passes of the target, prompt chunks included */
    uint64_t n_host_waits;    /* times the host waited on the device */
    double prompt_seconds;
    double generate_seconds;
    /* generation steps: one target forward each, after γ draft forwards */
    uint64_t n_steps;
    uint64_t n_drafted;     /* draft tokens proposed (0 without a draft) */
    uint64_t n_accepted;    /* draft tokens accepted */
    uint64_t n_evaluated;   /* drafts the target judged: accepted + one per rejection */
    double acceptance_rate; /* α = n_accepted / n_evaluated: the probability that a judged
                               draft is accepted (Leviathan et al.'s α); drafts after a
                               rejection are discarded unjudged and not counted */
    double tokens_per_step; /* generated tokens per target forward */
    uint64_t evaluated_at[SPECULA_MAX_GAMMA]; /* per draft position: judged, and accepted */
    uint64_t accepted_at[SPECULA_MAX_GAMMA];
    double draft_seconds; /* where generation time went */
    double target_seconds;
    double verify_seconds;
    int32_t last_gamma;
    uint64_t n_lookup_drafted;  /* of n_drafted, proposed by the lookup (lookup_ngram) */
    uint64_t n_lookup_accepted; /* of n_accepted, the lookup's */
    uint64_t n_shared_steps;    /* of n_steps, those run in one forward with other sessions' */
} specula_session_stats;

typedef struct specula_session specula_session;

SPECULA_API specula_session_params specula_session_default_params(void);
SPECULA_API void specula_session_default_params_by_ref(specula_session_params* params);
SPECULA_API specula_generate_params specula_generate_default_params(void);
SPECULA_API void specula_generate_default_params_by_ref(specula_generate_params* params);

/* A context on the model; the caller owns *out (specula_session_free), and the model (and the
 * draft) must outlive it. With a draft, the γ policy starts from what the last freed session of
 * the same target and draft measured (their costs and acceptance rate), as after
 * specula_session_reset. SPECULA_ERR_VOCAB_MISMATCH: the draft's vocabulary is not the target's
 * (the message names the first difference); SPECULA_ERR_OUT_OF_MEMORY: the context does not
 * fit the backend (nothing is allocated); SPECULA_ERR_INVALID_ARGUMENT: parameters out of range,
 * or a draft on another backend. */
SPECULA_API specula_status specula_session_create(specula_model* model,
                                                  const specula_session_params* params,
                                                  specula_session** out);
SPECULA_API void specula_session_free(specula_session* session);
/* Forgets the context (the KV cache) and the random step counter; keeps what the analytic γ
 * policy has measured of the pair (its costs and acceptance rate). */
SPECULA_API specula_status specula_session_reset(specula_session* session);
/* Changes the sampling settings of what follows (specula_session_params' meaning of each),
 * e.g. per request of a server's slot, without allocating the context again; forgets the
 * context as specula_session_reset does and keeps what the γ policy measured. What follows
 * is what a new session with these settings generates. Values out of range:
 * SPECULA_ERR_INVALID_ARGUMENT, and the session is as it was. */
SPECULA_API specula_status specula_session_set_sampling(specula_session* session, float temperature,
                                                        int32_t top_k, float top_p, uint64_t seed);

/* Appends tokens to the context and evaluates them in one batched forward per chunk.
 * SPECULA_ERR_CONTEXT_FULL: they do not fit (nothing is evaluated); SPECULA_ERR_INVALID_ARGUMENT:
 * an id outside the vocabulary; SPECULA_ERR_DEVICE_LOST: the GPU was lost (recreate the backend).
 */
SPECULA_API specula_status specula_session_eval(specula_session* session, const int32_t* tokens,
                                                size_t n_tokens);
/* The logits of the last evaluated position (n_vocab floats). */
SPECULA_API specula_status specula_session_get_logits(specula_session* session, float* logits,
                                                      size_t capacity);
/* Generates up to max_tokens after the current context. `tokens` (may be NULL
 * with capacity 0) receives the first `capacity` of them; *n_generated (may be
 * NULL) counts them all, as on_token sees them all. On an error, what was
 * generated before it is stored and counted. A speculative step may produce
 * tokens past the point where generation ends (max_tokens, EOS, on_token
 * returning false): they are kept and reported first by the next call, so the
 * tokens seen across calls are those of one uninterrupted run; evaluating
 * tokens or reading logits in between discards them. SPECULA_ERR_CONTEXT_FULL: the context
 * filled up; SPECULA_ERR_ABORTED: should_abort returned true; SPECULA_ERR_DEVICE_LOST. */
SPECULA_API specula_status specula_generate(specula_session* session,
                                            const specula_generate_params* params, int32_t* tokens,
                                            size_t capacity, size_t* n_generated);
/* Counters and times since the session was created or last reset. */
SPECULA_API specula_status specula_session_get_stats(const specula_session* session,
                                                     specula_session_stats* stats);
/* Backend memory the session's contexts hold (KV caches and activations): the target's, and
 * the draft's (0 without one). The weights are the models' (specula_model_info.weight_bytes). */
SPECULA_API specula_status specula_session_memory(const specula_session* session,
                                                  uint64_t* target_bytes, uint64_t* draft_bytes);

/* ----------------------------------------------------------------- speech */
/* Speech recognition with Whisper models in whisper.cpp's file format (ggml-*.bin). */

typedef struct specula_asr_model specula_asr_model;
typedef struct specula_asr_context specula_asr_context;

typedef struct specula_asr_model_info {
    int32_t n_vocab;
    int32_t n_audio_ctx; /* encoder positions: a window is n_audio_ctx / 50 seconds */
    int32_t n_audio_layer;
    int32_t n_text_ctx;
    int32_t n_text_layer;
    int32_t n_state; /* width */
    int32_t n_mels;
    bool multilingual;
    uint64_t n_params;
    specula_weight_type weight_type; /* the matrices' */
    int32_t n_output_tokens; /* the tokens it can output: n_vocab, fewer for a restricted draft */
} specula_asr_model_info;

/* Loads a whisper.cpp model file onto the backend (params as for specula_model_load; NULL for
 * the defaults). A GGUF file or another format: SPECULA_ERR_UNSUPPORTED / SPECULA_ERR_FORMAT.
 * The encoder's weights are checked here but uploaded by the model's first context
 * (specula_asr_context_create): a model that serves only as a draft decoding from its target's
 * encoding (a Distil-Whisper draft) never holds them. */
SPECULA_API specula_status specula_asr_model_load(specula_backend* backend, const char* path,
                                                  const specula_model_params* params,
                                                  specula_asr_model** out);
/* Loads a whisper.cpp model as a draft that proposes only `tokens` (ids of the vocabulary) and
 * the special and timestamp tokens, as FR-Spec does with the tokens a corpus uses most: its
 * output projection reads those rows alone, so each draft token costs less, and it proposes no
 * other token. Transcripts stay the target's (verification is exact whatever the subset); a
 * subset that misses tokens the target says costs acceptance. Ids out of range, or none below
 * <|endoftext|>: SPECULA_ERR_INVALID_ARGUMENT; n_tokens 0: as specula_asr_model_load. Such a
 * model serves only as specula_asr_params.draft (specula_asr_context_create refuses it). */
SPECULA_API specula_status specula_asr_draft_load(specula_backend* backend, const char* path,
                                                  const specula_model_params* params,
                                                  const int32_t* tokens, size_t n_tokens,
                                                  specula_asr_model** out);
SPECULA_API void specula_asr_model_free(specula_asr_model* model);
SPECULA_API specula_status specula_asr_model_get_info(const specula_asr_model* model,
                                                      specula_asr_model_info* info);

typedef struct specula_asr_segment {
    int64_t t0_ms, t1_ms; /* from the start of the audio */
    const char* text;     /* UTF-8, NUL-terminated; valid until the next transcription */
} specula_asr_segment;
typedef void (*specula_asr_segment_fn)(const specula_asr_segment* segment, void* user_data);

typedef struct specula_asr_params {
    const char* language; /* "en", "de", ...; "auto" detects it (multilingual models); NULL: "en" */
    bool translate;       /* to English (multilingual models) */
    bool timestamps;      /* segments timed by the model's timestamp tokens */
    bool condition_on_previous_text;
    float temperature;           /* 0: greedy */
    float temperature_increment; /* the fallback's step up to 1.0 (0.2); 0: no fallback */
    float entropy_threshold;     /* a window's last 32 tokens below this entropy: fall back (2.4) */
    float logprob_threshold;     /* mean token log-probability below this: fall back (-1) */
    float no_speech_threshold; /* P(no speech) above this with low log-probability: skipped (0.6) */
    uint64_t seed;             /* for the sampled fallbacks */
    /* Speculative decoding: a draft Whisper on the same backend with the target's vocabulary
     * (else SPECULA_ERR_VOCAB_MISMATCH), mel bins and window length; it encodes each window
     * itself, unless its encoder is the target's, byte for byte or quantized to another type (a
     * Distil-Whisper draft: then its decoder reads the target's encoding and the encoder runs
     * once per window). NULL
     * decodes with the target alone. The transcript is the target alone's, greedy or sampled
     * (the temperature fallback draws each draft with the target's noise at its position, the
     * coupled acceptance), with Whisper's rules on every position either way.
     * The context keeps the draft's caches between transcriptions with the same draft. */
    specula_asr_model* draft;
    specula_gamma_policy gamma_policy; /* as for text sessions (default auto) */
    int32_t gamma;                     /* 1..SPECULA_MAX_GAMMA (default 4) */
    int32_t gamma_max;                 /* 1..SPECULA_MAX_GAMMA (default 8) */
    specula_asr_segment_fn on_segment; /* each segment as it is decoded; may be NULL */
    void* segment_user_data;
    specula_progress_fn
        progress; /* fraction of the audio done; false aborts (SPECULA_ERR_ABORTED) */
    void* progress_user_data;
} specula_asr_params;

typedef struct specula_asr_timings {
    double audio_seconds;  /* of the input */
    double mel_seconds;    /* reading, resampling and the log-mel spectrogram */
    double encode_seconds; /* the encoder, all windows */
    double decode_seconds; /* the decoder and the rules */
    int32_t windows, fallbacks, tokens;
    char language[8]; /* the language transcribed (detected or given) */
    /* The decoder's steps (one target forward each), over every window and attempt: drafts
     * proposed, judged (accepted + one per rejection) and accepted, and where the decoding
     * time went (draft forwards and draws, target forwards, rules and verification). */
    uint64_t n_steps, n_emitted, n_drafted, n_evaluated, n_accepted;
    double draft_seconds, target_seconds, verify_seconds;
} specula_asr_timings;

SPECULA_API specula_asr_params specula_asr_default_params(void);
SPECULA_API void specula_asr_default_params_by_ref(specula_asr_params* params);
/* A transcription state on the model's backend (the encoder's output and the decoder's caches).
 * The first for a model also uploads its encoder's weights (SPECULA_ERR_OUT_OF_MEMORY leaves the
 * model as it was). The model (and a draft it is given) must outlive it; one thread at a time. */
SPECULA_API specula_status specula_asr_context_create(specula_asr_model* model,
                                                      specula_asr_context** out);
SPECULA_API void specula_asr_context_free(specula_asr_context* ctx);
/* Transcribes 16 kHz mono float samples in [-1, 1]; the segments replace the last ones.
 * SPECULA_ERR_VOCAB_MISMATCH: a draft whose vocabulary, mel bins or window differ;
 * SPECULA_ERR_INVALID_ARGUMENT: bad parameters, a draft on another backend;
 * SPECULA_ERR_ABORTED: the progress callback returned false. */
SPECULA_API specula_status specula_asr_transcribe(specula_asr_context* ctx, const float* samples,
                                                  size_t n_samples,
                                                  const specula_asr_params* params);
/* The same for an audio file: WAV (PCM 8/16/24/32-bit or float), FLAC, MP3, Ogg Vorbis or Opus
 * (and the other formats libsndfile reads), any rate and channel count. SPECULA_ERR_IO: it
 * cannot be read; SPECULA_ERR_FORMAT: not audio specula decodes; SPECULA_ERR_UNSUPPORTED: more
 * than four hours, 64 channels or 768 kHz. */
SPECULA_API specula_status specula_asr_transcribe_file(specula_asr_context* ctx, const char* path,
                                                       const specula_asr_params* params);
/* The same for an audio file's bytes in memory (an upload, an app's asset). */
SPECULA_API specula_status specula_asr_transcribe_memory(specula_asr_context* ctx, const void* data,
                                                         size_t size,
                                                         const specula_asr_params* params);
/* The last transcription's segments (0 for NULL); a segment's text stays valid until the next
 * transcription. */
SPECULA_API size_t specula_asr_segment_count(const specula_asr_context* ctx);
SPECULA_API specula_status specula_asr_get_segment(const specula_asr_context* ctx, size_t i,
                                                   specula_asr_segment* segment);
SPECULA_API specula_status specula_asr_get_timings(const specula_asr_context* ctx,
                                                   specula_asr_timings* timings);

/* Decodes an audio file (any format specula_asr_transcribe_file reads) to mono float samples at
 * the file's own rate, in memory that specula_audio_free releases. Statuses as that call's. */
SPECULA_API specula_status specula_audio_load(const char* path, float** samples, size_t* n_samples,
                                              int32_t* sample_rate);
SPECULA_API void specula_audio_free(float* samples);

/* ---- Live transcription ----
 * Audio pushed as it arrives (a microphone, a call), cut into utterances by voice activity
 * detection (WebRTC's VAD), each transcribed again every step_ms as it grows: the tokens two
 * consecutive hypotheses agree on are committed (they never change), and when the speaker
 * pauses for end_silence_ms the utterance is transcribed a last time and its segments are final.
 * Events come through on_event, in the thread that pushes, during the push that made them. */
typedef struct specula_asr_stream specula_asr_stream;

typedef struct specula_asr_stream_event {
    bool is_final;        /* a final segment (never changes), or the utterance's partial text */
    int64_t t0_ms, t1_ms; /* from the start of the stream */
    const char* text;     /* UTF-8, NUL-terminated; valid during the callback */
    size_t stable_bytes;  /* the first bytes of text that later partials and the finals keep
                           * (a final: all of it) */
} specula_asr_stream_event;
typedef void (*specula_asr_stream_fn)(const specula_asr_stream_event* event, void* user_data);

typedef struct specula_asr_stream_params {
    specula_asr_params asr;     /* language, thresholds, draft and gamma as for a transcription
                                 * (its on_segment and progress are not called) */
    int32_t vad_aggressiveness; /* 0 (keeps the most audio as speech) .. 3 (the least); 2 */
    int32_t step_ms;            /* new speech between partial hypotheses (1000); 0: finals only */
    int32_t end_silence_ms;     /* silence that ends an utterance (600; 100 .. 10000) */
    int32_t pre_roll_ms;        /* audio kept before an utterance's first voiced frame (30) */
    int32_t max_utterance_ms;   /* longer: its finished segments become final (20000; <= 28000) */
    specula_asr_stream_fn on_event;
    void* event_user_data;
} specula_asr_stream_params;

SPECULA_API specula_asr_stream_params specula_asr_stream_default_params(void);
SPECULA_API void specula_asr_stream_default_params_by_ref(specula_asr_stream_params* params);
/* A stream over a context (which must outlive it, and transcribes nothing else while it is open,
 * not even a second stream: SPECULA_ERR_INVALID_ARGUMENT). Parameters out of range:
 * SPECULA_ERR_INVALID_ARGUMENT naming the field. Memory stays bounded however long the stream. */
SPECULA_API specula_status specula_asr_stream_create(specula_asr_context* ctx,
                                                     const specula_asr_stream_params* params,
                                                     specula_asr_stream** out);
/* Mono float samples in [-1, 1] at sample_rate Hz (resampled to 16 kHz as they come). Every
 * push of a stream has the rate of its first; another rate, more than 600 s at once, or a push
 * after finish: SPECULA_ERR_INVALID_ARGUMENT, and nothing is consumed. */
SPECULA_API specula_status specula_asr_stream_push(specula_asr_stream* stream, const float* samples,
                                                   size_t n_samples, int32_t sample_rate);
/* The same for 16-bit little-endian PCM bytes (an odd n_bytes: SPECULA_ERR_INVALID_ARGUMENT; the
 * caller keeps the odd byte for its next push). */
SPECULA_API specula_status specula_asr_stream_push_pcm16(specula_asr_stream* stream,
                                                         const void* data, size_t n_bytes,
                                                         int32_t sample_rate);
/* The end of the audio: the utterance under way becomes final. */
SPECULA_API specula_status specula_asr_stream_finish(specula_asr_stream* stream);
/* The audio pushed and every decoding's timings and speculation counters so far. */
SPECULA_API specula_status specula_asr_stream_get_timings(const specula_asr_stream* stream,
                                                          specula_asr_timings* timings);
SPECULA_API void specula_asr_stream_free(specula_asr_stream* stream);

#ifdef __cplusplus
}
#endif

#endif /* SPECULA_H */
