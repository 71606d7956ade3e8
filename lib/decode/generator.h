// Token generation for a session: plain decoding with the target alone, or
// speculative decoding with a draft model (docs/DESIGN.md "Speculative decoding"). Both are one
// loop: each step drafts γ tokens (γ = 0 without a draft), runs the target once on the last
// committed token plus the drafts, verifies, commits n + 1 tokens and rolls both KV caches back to
// what was committed.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "decode/decoder.h"
#include "decode/ngram_lookup.h"
#include "sampling/mask_program.h"
#include "sampling/sampling.h"
#include "sampling/verify.h"

namespace specula {

constexpr int kMaxGamma =
    SPECULA_MAX_GAMMA;  // the target then evaluates up to 17 positions at once

enum class GammaPolicy {
    kFixed,      // always `gamma`
    kHeuristic,  // start at 5; +2 after a step that accepted every draft, -1 otherwise; at least 1
    kAnalytic,   // the γ (0 included) with the most expected tokens per second, from the measured
                 // α, draft cost and target cost per number of positions (best_gamma())
};

struct GeneratorStats {
    uint64_t steps = 0;
    uint64_t drafted = 0;
    uint64_t evaluated = 0;  // drafts the target judged: the accepted ones, plus one per rejection
    uint64_t accepted = 0;
    uint64_t emitted = 0;
    std::array<uint64_t, kMaxGamma> evaluated_at{};  // per draft position
    std::array<uint64_t, kMaxGamma> accepted_at{};
    uint64_t lookup_drafted = 0, lookup_accepted = 0;  // of the model-free drafts (NgramLookup)
    double draft_seconds = 0, target_seconds = 0, verify_seconds = 0;
    int last_gamma = 0;
};

// The seconds of a step's draft calls (forward and draw). The first evaluates what the draft
// has not seen of the committed tokens, one or two (the target's own token, and the last draft
// where every draft was accepted), after the target's call has had the caches; each later one
// evaluates the draft before it, so the first costs more (twice the others with the bundled
// speech pair): priced alike, several drafts would look dearer than they are. A later call
// does no more than the first, so it is priced at most as the first: `next` is measured only in
// steps of two drafts or more, and one slow measurement of it (a thread that lost its core)
// would otherwise hold the policy at one draft a step, where `next` is never measured again.
struct DraftCost {
    double first = 0;
    double next = 0;  // 0: not measured yet, priced as the first
    double of(int gamma) const {
        const double later = next > 0 ? std::min(next, first) : first;
        return gamma <= 0 ? 0.0 : first + double(gamma - 1) * later;
    }
};

// Tokens and seconds of the steps of one kind, by the device's clock from a step's first call to
// its verification (a probe's catch-up on the tokens the draft missed is a cost of switching, not
// of drafting), decaying: each step adds itself at full weight and takes kDecay off what the ones
// before weigh (about the last five steps count). The first `skip` steps are not counted (steps
// with drafts: a first use of the draft), and a step slower than three times the mean of those
// before it (a thread that lost its core) counts as three times the mean. A step slower than
// `slowest` (> 0) is not counted at all: a plain step is one target forward, so one over
// kSlowPlainStep times a plain forward's running mean (which one slow measurement moves
// little) is a lost core, not plain decoding's rate; plain steps come only in a pair every
// kProbeEvery steps while drafting wins, so even clamped such a step would set the rate
// drafting is judged against (drafting_loses()) for several pairs. What the analytic policy's
// estimates are checked against.
struct RealizedRate {
    static constexpr double kDecay = 0.8;
    static constexpr int kSkipFirst = 2;
    static constexpr double kSlowPlainStep = 1.25;
    double tokens = 0, seconds = 0, steps = 0;
    int seen = 0;
    void add(double step_tokens, double step_seconds, int skip, double slowest = 0) {
        if (++seen <= skip || (slowest > 0 && step_seconds > slowest)) return;
        if (steps >= 2) step_seconds = std::min(step_seconds, 3.0 * seconds / steps);
        tokens = kDecay * tokens + step_tokens;
        seconds = kDecay * seconds + step_seconds;
        steps = kDecay * steps + 1;
    }
    double rate() const { return seconds > 0 ? tokens / seconds : 0; }
};

// Whether steps with drafts have been emitting fewer tokens per second than plain steps, over
// enough of both to say so: the analytic policy's estimate of a draft's worth can be wrong
// (caches a draft model shares with the target, an α that changed with the text, a cost that
// moved), and the policy then decodes plainly but for its probes.
bool drafting_loses(const RealizedRate& drafting, const RealizedRate& plain);

// What the analytic policy has measured of one kind of step of a target/draft pair on its
// backend: running means of the draft calls and of a target forward of n positions with its
// verify pass (index n; 0 = not measured yet), the drafts judged and accepted, and the tokens
// emitted and how many of them were the end token (Config::end_token).
struct StepMeasurements {
    DraftCost draft;
    std::array<double, kMaxGamma + 2> target_seconds{};
    // How often each was measured (updated_cost()).
    int draft_first_samples = 0, draft_next_samples = 0;
    std::array<int, kMaxGamma + 2> target_samples{};
    uint64_t judged = 0, accepted = 0;
    uint64_t emitted = 0, ended = 0;
    // Steps with drafts since the plain width (one position) was last measured: while drafting
    // wins, two plain steps now and then measure it again. Counted with the measurements, not
    // per sequence: a speech window ends in ~10 steps, and a count per window would never reach
    // the next plain measurement.
    int drafting_since_plain = 0;
    // The draft's cost of evaluating a token it missed (the prompt, plain steps), in the batched
    // forward that brings it up to date before a step with drafts: what a probe pays for every
    // plain step before it (probe_priced_out()).
    double catch_up_token = 0;
    int catch_up_samples = 0;
    // The model-free drafts judged and accepted, per length of the suffix the lookup matched
    // (a draft that continues a long match is accepted more often than one after one token).
    std::array<uint64_t, kMaxLookupNgram + 1> lookup_judged{}, lookup_accepted{};
    // The tokens per second steps realized: with the draft model's drafts, with the lookup's,
    // and plain ones (those that measure plain decoding).
    RealizedRate realized_model, realized_lookup, realized_plain;
};

// A pair's measurements, of greedy steps and of sampled ones apart: a sampled step draws every
// verified row over the vocabulary (a verification of n positions costs more) and accepts
// fewer drafts, and a transcription switches between the two (its temperature fallback), where
// one set of means fitted neither. Generator::reset() keeps them, so a new sequence of the same
// pair starts from them instead of probing again; a speech context keeps them per draft for
// all its transcriptions (a 5 s window has ~15 tokens, about as many as the probes take).
struct PairMeasurements {
    StepMeasurements greedy, sampled;
    // For a new conversation: what the drafts realized was on another text, so it is judged by
    // the estimates (costs, α) first.
    void forget_realized() {
        for (StepMeasurements* m : {&greedy, &sampled})
            m->realized_model = m->realized_lookup = RealizedRate{};
    }
};

// A running mean of a cost after one more measurement of it (`samples` before this one). What
// slows a step (a thread that lost its core, cold caches, first-use allocations) only adds time,
// so a measurement under half the mean replaces it (the mean was of slowed steps), the first two
// give the faster of them, and then the mean takes 0.9 of itself and 0.1 of the measurement,
// counted as at most twice the mean. Unclamped, one step on which the thread lost its core
// moved a 150 µs mean to 440 µs and sent the analytic policy to widths it then kept for
// hundreds of steps, since a width it no longer picks is measured again only by a probe; and
// a first draft step measured 20 times its cost (a busy machine) kept a pair from drafting for
// the rest of its life, each probe taking a twentieth off the mean.
double updated_cost(double mean, int samples, double seconds);

class Generator {
  public:
    struct Config {
        SamplingParams sampling;
        GammaPolicy policy = GammaPolicy::kHeuristic;
        int gamma = 5;                // the fixed γ, and the start of the adaptive policies
        int gamma_max = 8;            // upper bound of the adaptive policies (<= kMaxGamma)
        bool sigmoid_verify = false;  // the non-exact variant (verify_sigmoid)
        SigmoidScale sigmoid_scale;
        // Sampled drafts drawn with the noise the target draws with at their position, accepted
        // while the target's draw agrees: the output is the target alone's for the seed,
        // whatever the draft and γ (docs/DESIGN.md "Speculative decoding").
        bool coupled = false;
        // A token after which nothing is wanted (Whisper's <|endoftext|>); -1: none. A step
        // emits nothing after it, and drafts after it are neither judged nor counted: the
        // verification still computed them (the drafts are drawn on the device), but α and the
        // tokens per step are what the caller gets.
        int32_t end_token = -1;
        // > 0: model-free drafts too (NgramLookup, suffixes of up to this many tokens). A step
        // takes the lookup's drafts where it found some and the policy expects them to pay
        // (more than the draft model's, where there is one). Its drafts are judged by the
        // coupled test when sampling, whatever `coupled` says: a proposal is one token, not a
        // draw, which both tests accept with probability p(x); the coupled one emits the
        // target's own draws.
        int lookup_ngram = 0;
    };

    // `draft` may be null (plain decoding). Both decoders must be empty, and their token ids
    // must mean the same text over the ids both have (Tokenizer::check_draft): a draft with
    // more ids never proposes those the target lacks, and one with fewer reads each committed
    // id it lacks (an unused id of the target's padding) as id 0, which may make its drafts
    // worse, never the output other than the target's.
    // `measurements`, where given, outlives the generator and is the pair's: it is read and
    // updated instead of the generator's own.
    Generator(Decoder& target, Decoder* draft, const Config& config,
              PairMeasurements* measurements = nullptr);
    // Not copied or moved: it may point at its own measurements.
    Generator(const Generator&) = delete;
    Generator& operator=(const Generator&) = delete;

    // Appends tokens to the committed sequence (the prompt). Every token but the last
    // is evaluated now, in batches; the last is evaluated by the next step.
    Status append(std::span<const int32_t> tokens);
    // One step: appends 1..γ+1 tokens to `out` (at most max_tokens, at least 1). With token
    // rules, `logprobs` (if not null) gets each token's log-probability under the target's
    // masked distribution at temperature 1 (its logit minus log_sum_exp of its row).
    Status step(int max_tokens, std::vector<int32_t>* out, std::vector<float>* logprobs = nullptr);
    // A plain step (no drafts) whose forward the caller records, with other sequences' in one
    // pass (LlamaBatch): prepare_plain_step() makes the target hold every committed token but
    // the last and gives that one; the caller evaluates it at the target's next position so that
    // the target's logits(1) hold its row; finish_plain_step() then draws, commits and counts
    // the step as step() does a plain one (the shared forward's time is not measured as the
    // pair's plain cost). The token is the one step() would emit.
    Status prepare_plain_step(int32_t* token);
    Status finish_plain_step(std::vector<int32_t>* out);
    // From now until reset(), every drafted and verified row is masked by `program` on the
    // device before it is sampled or judged, each from the tokens committed after this call plus
    // the drafts before it (Whisper's rules: asr/rules.h).
    void begin_masks(const MaskProgram& program);
    // The sampling of the next steps (e.g. a temperature fallback).
    void set_sampling(const SamplingParams& sampling) { config_.sampling = sampling; }
    // Drops every committed token and all state but the policy's measurements of the pair.
    void reset();
    // Drops the last n committed tokens (at most all but one): the caches forget them too.
    void forget(size_t n);

    // The target's logits after the committed sequence (evaluates the pending token if needed).
    Status last_logits(std::vector<float>* out);

    const std::vector<int32_t>& committed() const { return committed_; }
    const GeneratorStats& stats() const { return stats_; }
    // The measurements of the steps the current sampling takes (greedy or sampled).
    const StepMeasurements& measurements() const { return current_measurements(); }
    // The draft model's γ for the next step (0 without a draft model).
    int next_gamma() const;

  private:
    // What a step drafts: γ drafts of the draft model, or of the lookup (`lookup`).
    struct StepPlan {
        int gamma = 0;
        bool lookup = false;
        NgramLookup::Match match;
    };
    StepPlan plan_step();
    // The γ (0 included) of the lookup's drafts after a match of `ngram` tokens.
    int lookup_gamma(int ngram) const;
    // Makes ctx hold exactly the committed tokens but the last `keep`: forgets positions
    // beyond them and evaluates the missing ones.
    Status catch_up(Decoder& ctx, size_t keep, std::vector<float>* logits);
    // committed_[begin, end) as ctx reads them: the draft reads ids past its vocabulary as 0.
    std::span<const int32_t> committed_for(const Decoder& ctx, size_t begin, size_t end);
    // The draft's row of draft c's logits over the target's vocabulary (device_buffers()).
    Tensor draft_row(int c);
    Status check_step(int max_tokens, const std::vector<float>* logprobs) const;
    // step()'s body; `forward_done`: a plain step whose target forward the caller recorded.
    Status run_step(StepPlan plan, int max_tokens, std::vector<int32_t>* out,
                    std::vector<float>* logprobs, bool forward_done);
    // `proposed`: the step's drafts come from the host (the lookup), not the draft model.
    Status step_on_device(int gamma, const std::vector<int32_t>* proposed,
                          std::vector<int32_t>* emitted, std::vector<float>* logprobs,
                          bool forward_done);
    Status sigmoid_step_on_host(int gamma, std::vector<int32_t>* emitted);
    Status device_buffers(int n_vocab);
    // The most drafts a step can have: the rows of the step's buffers.
    int max_drafts() const { return std::max(config_.gamma, config_.gamma_max); }
    void commit(std::span<const int32_t> tokens);
    void adapt_gamma(int n_accepted, int gamma);
    // The steps of the current sampling's kind, of the pair's measurements (*measured_); a
    // const generator reads them only.
    StepMeasurements& current_measurements() {
        return config_.sampling.greedy() ? measured_->greedy : measured_->sampled;
    }
    const StepMeasurements& current_measurements() const {
        return config_.sampling.greedy() ? measured_->greedy : measured_->sampled;
    }

    Decoder& target_;
    Decoder* draft_;
    Config config_;
    std::vector<int32_t> committed_;
    uint32_t step_ = 0;
    int heuristic_gamma_;
    PairMeasurements own_measurements_;
    PairMeasurements* measured_;  // own_measurements_ or the caller's
    int plain_steps_ = 0;         // steps in a row without drafts
    static constexpr int kProbeEvery = 16, kMaxProbeEvery = 256;
    static constexpr int kNeverProbe = 1 << 30;
    int probe_every_ = kProbeEvery;  // a step with drafts after this many plain ones
    int costly_probes_ = 0;          // costly_probe()s in a row
    // What the steps with the draft model's drafts saved in this sequence against plain steps
    // (at the measured plain cost), never below 0: what a probe may spend (probe_priced_out()).
    double drafting_saved_ = 0;
    GeneratorStats stats_;
    std::optional<MaskProgram> masks_;
    size_t masks_from_ = 0;  // committed_[masks_from_..] are the tokens the masks see
    std::vector<std::unique_ptr<Buffer>> buffers_;
    Tensor draft_rows_, result_, lse_, races_;  // on the target's backend
    std::vector<int32_t> draft_ids_;            // committed_for()'s
    double step_seconds_ = 0;  // the last step's, from its first call to its verification
    std::optional<NgramLookup> lookup_;
};

// Leviathan et al. Theorem 3.8: the expected speedup of γ drafts per step with
// acceptance rate alpha and draft/target cost ratio c, for a target whose forward costs the
// same for γ + 1 positions as for one.
double expected_speedup(double alpha, double c, double gamma);

// The seconds of a target forward of n positions, from running means measured for some n
// (measured[n] > 0): a measured n's own, else the line through the nearest measured n on
// either side (or the two nearest on one side; one measured n: the same for every n).
// 0 when nothing is measured.
double estimated_target_seconds(std::span<const double> measured, int n);

// The γ in [gamma_min, gamma_max] with the most expected tokens per second: Theorem 3.8 for a
// target whose forward of γ + 1 positions costs what it costs (on a CPU, or any device where the
// model is compute bound, several times one position), tokens(γ) / (draft.of(γ) +
// target_seconds(γ + 1)). γ = 0 is plain decoding, one token per target_seconds(1).
int best_gamma(double alpha, const DraftCost& draft, std::span<const double> target_seconds,
               int gamma_min, int gamma_max);

// The analytic policy's γ for what `m` measured: best_gamma() for the acceptance rate
// (accepted + 1) / (judged + 2), times the chance that an accepted draft does not end the
// sequence (a draft after the end token is not wanted: Whisper's windows end every ~13 tokens,
// where 4 drafts a step gave 2.99 tokens a call, not the 3.49 that α 0.82 alone predicts, and
// 3.09 with the end counted); where that is plain decoding, γ = 1 while the rate plus one
// standard error still has drafting pay (an unlucky start is judged again, a poor draft is not).
int analytic_gamma(const StepMeasurements& m, int gamma_min, int gamma_max);

// The expected tokens per second of steps of γ drafts (tokens(γ) over their seconds), as
// best_gamma() weighs them.
double expected_rate(double alpha, const DraftCost& draft, std::span<const double> target_seconds,
                     int gamma);

// Whether a probe (a step with drafts after `plain_steps` plain ones, which plain decoding
// still won) cost more beyond plain decoding (its time less its `emitted` tokens at
// `plain_seconds` each) than a twentieth of the plain steps before it. The draft first
// evaluates every token it missed since the last probe, so a draft that costs that much per
// token costs it however rarely it probes: on the cpu a 134M pair drafting with its own Q4_0
// weights lost 13-18% of plain decoding to probes every 16-256 steps. Two in a row end the
// probing until Generator::reset().
bool costly_probe(double step_seconds, size_t emitted, double plain_seconds, int plain_steps);

// Whether a probe after plain steps costs more than they allow, priced before it is made: the
// draft first evaluates the `missed` tokens, at `catch_up_token` seconds each, where the plain
// steps allow a twentieth of their time (`missed` × `plain_seconds`, as costly_probe()) and
// what drafting saved earlier in the sequence (`saved`). A draft as large as its target (on a
// GPU a batched forward took 0.37 ms a token against 1.3 ms for a decode step) can probe only
// on what its drafts saved; a 2-layer draft of 16 layers can probe anyway. The price needs two
// measurements of the catch-up (`catch_up_samples`; updated_cost() keeps the faster): one
// slowed by a busy machine would otherwise end the probing, which alone measures it again.
bool probe_priced_out(double catch_up_token, int catch_up_samples, double plain_seconds, int missed,
                      double saved);

}  // namespace specula
