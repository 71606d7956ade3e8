#include "decode/generator.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "sampling/verify.h"

namespace specula {

namespace {

using Clock = std::chrono::steady_clock;

// The backend's time slots of a step on the device (Backend::mark_time()).
enum TimeMark : int {
    kStepStart,
    kDraftsDone,
    kTargetDone,
    kVerified,
    kFirstDraftDone,
    kCatchUpStart
};

// What a probe may cost beyond plain decoding: this share of the plain steps before it.
constexpr double kProbeShare = 1.0 / 20;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Tokens a step of γ drafts emits on average (Leviathan et al. eq. 1).
double expected_tokens(double alpha, double gamma) {
    return alpha >= 1.0 ? gamma + 1.0 : (1.0 - std::pow(alpha, gamma + 1.0)) / (1.0 - alpha);
}

}  // namespace

double expected_speedup(double alpha, double c, double gamma) {
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0);
}

double estimated_target_seconds(std::span<const double> measured, int n) {
    if (n > 0 && size_t(n) < measured.size() && measured[size_t(n)] > 0) return measured[size_t(n)];
    // The nearest measured widths below and above n, or the two nearest on its one side.
    int below = 0, above = 0, below2 = 0, above2 = 0;
    for (int m = 1; size_t(m) < measured.size(); ++m) {
        if (!(measured[size_t(m)] > 0)) continue;
        if (m < n) {
            below2 = below;
            below = m;
        } else if (above == 0) {
            above = m;
        } else if (above2 == 0) {
            above2 = m;
        }
    }
    int a = below, b = above;
    if (a == 0) {  // nothing below: the two nearest above
        a = b;
        b = above2;
    }
    if (b == 0) {  // nothing above: the two nearest below
        b = a;
        a = below2;
    }
    if (b == 0) return 0;                    // nothing measured
    if (a == 0) return measured[size_t(b)];  // one width measured
    const double ta = measured[size_t(a)], tb = measured[size_t(b)];
    return std::max(ta + (tb - ta) * double(n - a) / double(b - a), 0.0);
}

double expected_rate(double alpha, const DraftCost& draft, std::span<const double> target_seconds,
                     int gamma) {
    return expected_tokens(alpha, gamma) /
           (draft.of(gamma) + estimated_target_seconds(target_seconds, gamma + 1));
}

int best_gamma(double alpha, const DraftCost& draft, std::span<const double> target_seconds,
               int gamma_min, int gamma_max) {
    int best = -1;
    double best_rate = 0;
    for (int g = gamma_min; g <= gamma_max; ++g) {
        const double rate = expected_rate(alpha, draft, target_seconds, g);
        if (best < 0 || rate > best_rate) {
            best = g;
            best_rate = rate;
        }
    }
    return best;
}

double updated_cost(double mean, int samples, double seconds) {
    // A mean of 0 (a clock too coarse for the step) would clamp every later measurement to 0.
    if (!(mean > 0) || seconds < 0.5 * mean) return seconds;
    if (samples < 2) return std::min(mean, seconds);
    return 0.9 * mean + 0.1 * std::min(seconds, 2.0 * mean);
}

int analytic_gamma(const StepMeasurements& m, int gamma_min, int gamma_max) {
    const double n = double(m.judged) + 2.0;
    const double alpha = std::min((double(m.accepted) + 1.0) / n, 0.999);
    const double goes_on = 1.0 - double(m.ended) / double(m.emitted + 1);
    const int gamma = best_gamma(alpha * goes_on, m.draft, m.target_seconds, gamma_min, gamma_max);
    if (gamma > 0) return gamma;
    // Plain decoding measures α no more: a few unlucky first drafts must not settle on it.
    // One draft a step while α with one standard error added says drafting pays; a draft
    // that is poor indeed loses the benefit of the doubt as its judged drafts accumulate.
    const double optimistic = std::min(alpha + std::sqrt(alpha * (1.0 - alpha) / n), 0.999);
    return std::min(best_gamma(optimistic * goes_on, m.draft, m.target_seconds, 0, gamma_max), 1);
}

bool drafting_loses(const RealizedRate& drafting, const RealizedRate& plain) {
    // Three recent steps' weight of drafting (one or two decide nothing on a noisy machine); a
    // plain step costs much the same every time, and the policy takes few while drafting wins.
    return drafting.steps >= 3.0 && plain.steps >= 1.0 && drafting.rate() < plain.rate();
}

bool costly_probe(double step_seconds, size_t emitted, double plain_seconds, int plain_steps) {
    if (!(plain_seconds > 0)) return false;  // nothing to weigh it against
    const double overhead = step_seconds - double(emitted) * plain_seconds;
    return overhead > kProbeShare * plain_seconds * double(plain_steps);
}

bool probe_priced_out(double catch_up_token, int catch_up_samples, double plain_seconds, int missed,
                      double saved) {
    if (catch_up_samples < 2 || !(plain_seconds > 0)) return false;
    return (catch_up_token - kProbeShare * plain_seconds) * double(missed) > saved;
}

Generator::Generator(Decoder& target, Decoder* draft, const Config& config,
                     PairMeasurements* measurements)
    : target_(target),
      draft_(draft),
      config_(config),
      measured_(measurements != nullptr ? measurements : &own_measurements_) {
    config_.gamma_max = std::clamp(config_.gamma_max, 1, kMaxGamma);
    config_.gamma = std::clamp(config_.gamma, 1, kMaxGamma);
    heuristic_gamma_ = config_.gamma;
    if (config_.lookup_ngram > 0) lookup_.emplace(config_.lookup_ngram);
}

void Generator::reset() {
    committed_.clear();
    target_.truncate(0);
    if (draft_) draft_->truncate(0);
    step_ = 0;
    heuristic_gamma_ = config_.gamma;
    plain_steps_ = 0;
    probe_every_ = kProbeEvery;
    costly_probes_ = 0;
    drafting_saved_ = 0;
    stats_ = GeneratorStats{};
    masks_.reset();
    masks_from_ = 0;
    if (lookup_) lookup_->truncate(0);
}

void Generator::begin_masks(const MaskProgram& program) {
    masks_ = program;
    masks_from_ = committed_.size();
}

Status Generator::catch_up(Decoder& ctx, size_t keep, std::vector<float>* logits) {
    const size_t end = committed_.size() - std::min(keep, committed_.size());
    ctx.truncate(int(std::min(end, size_t(ctx.n_past()))));
    for (size_t i = size_t(ctx.n_past()); i < end; i += size_t(ctx.max_batch())) {
        const size_t n = std::min(end - i, size_t(ctx.max_batch()));
        SPECULA_TRY(ctx.forward(committed_for(ctx, i, i + n), false, logits));
    }
    return Status::Ok();
}

std::span<const int32_t> Generator::committed_for(const Decoder& ctx, size_t begin, size_t end) {
    const std::span<const int32_t> ids = std::span(committed_).subspan(begin, end - begin);
    if (ctx.n_vocab() >= target_.n_vocab()) return ids;
    draft_ids_.resize(ids.size());
    std::transform(ids.begin(), ids.end(), draft_ids_.begin(),
                   [&](int32_t id) { return id < ctx.n_vocab() ? id : 0; });
    return draft_ids_;
}

Status Generator::append(std::span<const int32_t> tokens) {
    committed_.insert(committed_.end(), tokens.begin(), tokens.end());
    std::vector<float> logits;
    // The draft evaluates the prompt in its first step with drafts (step_on_device closes any
    // gap): a pair whose measurements say plain decoding wins never makes it read the prompt.
    SPECULA_TRY(catch_up(target_, 1, &logits));
    return Status::Ok();
}

Status Generator::last_logits(std::vector<float>* out) {
    if (committed_.empty()) return InvalidArgument("no position has been evaluated yet");
    // Re-evaluates the last token when the target already holds it: its logits are not kept.
    target_.truncate(int(committed_.size()) - 1);
    return catch_up(target_, 0, out);
}

int Generator::next_gamma() const {
    if (draft_ == nullptr) return 0;
    switch (config_.policy) {
        case GammaPolicy::kFixed:
            return config_.gamma;
        case GammaPolicy::kHeuristic:
            return heuristic_gamma_;
        case GammaPolicy::kAnalytic: {
            // First two plain steps (the first, after the prompt, measures nothing) and a step
            // of two drafts: two target widths measured, the first draft call and a later one
            // (DraftCost), and a first α; then the best γ for what has been measured. Two, not
            // `gamma`: with a poor draft (α 0.3, the 1B-shaped pair) a first step of five cost
            // a short text more than its drafts gave back, and a good one is drafting more a
            // few steps later.
            const StepMeasurements& m = current_measurements();
            if (m.target_seconds[1] <= 0) return 0;
            if (m.draft.first <= 0 || (m.draft_next_samples == 0 && config_.gamma_max > 1))
                return std::min(2, config_.gamma_max);
            // While plain decoding wins, a step with drafts now and then keeps α and the
            // costs measured (they change with the text and the context length); while
            // drafting wins, two plain steps now and then keep the cost it is weighed against
            // measured (a lone plain step measures nothing: step_on_device).
            if (m.drafting_since_plain + 1 >= kProbeEvery || plain_steps_ == 1) return 0;
            const int gamma_min =
                plain_steps_ + 1 >= probe_every_ &&
                        !probe_priced_out(m.catch_up_token, m.catch_up_samples, m.target_seconds[1],
                                          plain_steps_ + 1, drafting_saved_)
                    ? 1
                    : 0;
            // Drafting that has realized less than plain decoding stops but for the probes,
            // whatever the estimate says.
            if (gamma_min == 0 && drafting_loses(m.realized_model, m.realized_plain)) return 0;
            const int gamma = analytic_gamma(m, gamma_min, config_.gamma_max);
            // A width measured once is measured again while drafting (updated_cost() keeps the
            // faster of the first two): its one measurement may be of a first use (the first
            // step of drafts, right after the prompt: the bundled speech pair's target took
            // 0.66-0.79 ms for 5 positions there, 0.54 warm), and a width the policy does not
            // pick is not measured again, so the widths beside it were priced from it.
            if (gamma > 0)
                for (int g = 1; g <= config_.gamma_max; ++g)
                    if (m.target_samples[size_t(g + 1)] == 1) return g;
            return gamma;
        }
    }
    return config_.gamma;
}

int Generator::lookup_gamma(int ngram) const {
    switch (config_.policy) {
        case GammaPolicy::kFixed:
            return config_.gamma;
        case GammaPolicy::kHeuristic:
            return heuristic_gamma_;
        case GammaPolicy::kAnalytic:
            break;
    }
    // As the draft model's analytic γ, with the lookup's α after a match this long and drafts
    // that cost nothing: plain decoding measured first (two plain steps), then each width the
    // policy picks measured twice.
    const StepMeasurements& m = current_measurements();
    if (m.target_seconds[1] <= 0) return 0;
    // Plain steps in pairs only where a draft model shares the caches (next_gamma()).
    if (m.drafting_since_plain + 1 >= kProbeEvery || (plain_steps_ == 1 && draft_ != nullptr))
        return 0;
    if (plain_steps_ + 1 < probe_every_ && drafting_loses(m.realized_lookup, m.realized_plain))
        return 0;
    StepMeasurements lookup = m;
    lookup.draft = DraftCost{};
    lookup.judged = m.lookup_judged[size_t(ngram)];
    lookup.accepted = m.lookup_accepted[size_t(ngram)];
    const int gamma = analytic_gamma(lookup, 0, config_.gamma_max);
    if (gamma > 0)
        for (int g = 1; g <= config_.gamma_max; ++g)
            if (m.target_samples[size_t(g + 1)] == 1) return g;
    return gamma;
}

Generator::StepPlan Generator::plan_step() {
    StepPlan plan;
    plan.gamma = next_gamma();
    if (!lookup_) return plan;
    NgramLookup::Match match = lookup_->find(committed_, max_drafts());
    if (match.ngram == 0) return plan;
    const int gamma = lookup_gamma(match.ngram);
    if (gamma <= 0) return plan;
    if (plan.gamma > 0 && config_.policy == GammaPolicy::kAnalytic) {
        // The draft model's steps against the lookup's, as the policy expects them to go.
        const StepMeasurements& m = current_measurements();
        const auto alpha = [](uint64_t accepted, uint64_t judged) {
            return std::min((double(accepted) + 1.0) / (double(judged) + 2.0), 0.999);
        };
        const double model =
            expected_rate(alpha(m.accepted, m.judged), m.draft, m.target_seconds, plan.gamma);
        const double lookup = expected_rate(
            alpha(m.lookup_accepted[size_t(match.ngram)], m.lookup_judged[size_t(match.ngram)]),
            DraftCost{}, m.target_seconds, gamma);
        if (model > lookup) return plan;
    }
    match.drafts.resize(size_t(gamma));
    return {gamma, true, std::move(match)};
}

void Generator::adapt_gamma(int n_accepted, int gamma) {
    if (gamma == 0) return;
    heuristic_gamma_ = n_accepted == gamma ? std::min(heuristic_gamma_ + 2, config_.gamma_max)
                                           : std::max(heuristic_gamma_ - 1, 1);
}

Status Generator::check_step(int max_tokens, const std::vector<float>* logprobs) const {
    if (committed_.empty()) return InvalidArgument("evaluate a prompt before generating");
    if (logprobs != nullptr && !masks_)
        return InvalidArgument("log-probabilities come with a mask program only");
    if (masks_ && config_.sigmoid_verify)
        return InvalidArgument("the sigmoid verification takes no mask program");
    if (max_tokens < 1) return InvalidArgument("a step emits at least one token");
    const size_t L = committed_.size();
    if (L > size_t(target_.n_ctx()))
        return {SPECULA_ERR_CONTEXT_FULL,
                "the context of " + std::to_string(target_.n_ctx()) + " tokens is full"};
    if (L + size_t(kMaxGamma) >= kMaxPositions)  // position_row's range
        return {SPECULA_ERR_CONTEXT_FULL, "sampling is defined for the first 2^24 positions"};
    return Status::Ok();
}

Status Generator::step(int max_tokens, std::vector<int32_t>* out, std::vector<float>* logprobs) {
    SPECULA_TRY(check_step(max_tokens, logprobs));
    return run_step(plan_step(), max_tokens, out, logprobs, false);
}

Status Generator::prepare_plain_step(int32_t* token) {
    SPECULA_TRY(check_step(1, nullptr));
    std::vector<float> unused;
    SPECULA_TRY(catch_up(target_, 1, &unused));
    *token = committed_.back();
    return Status::Ok();
}

Status Generator::finish_plain_step(std::vector<int32_t>* out) {
    return run_step(StepPlan{}, 1, out, nullptr, true);
}

Status Generator::run_step(StepPlan plan, int max_tokens, std::vector<int32_t>* out,
                           std::vector<float>* logprobs, bool forward_done) {
    const int L = int(committed_.size());
    // γ drafts need γ more target positions (and γ - 1 more draft positions) after the last
    // committed token.
    int gamma = std::min({plan.gamma, max_tokens - 1, target_.n_ctx() - L});
    if (draft_ && !plan.lookup) gamma = std::min(gamma, draft_->n_ctx() - L + 1);
    gamma = std::max(gamma, 0);
    plan.match.drafts.resize(size_t(plan.lookup ? gamma : 0));

    std::vector<int32_t> emitted;
    const size_t logprobs_before = logprobs != nullptr ? logprobs->size() : 0;
    const auto t0 = Clock::now();
    SPECULA_TRY(config_.sigmoid_verify && gamma > 0 && !plan.lookup
                    ? sigmoid_step_on_host(gamma, &emitted)
                    : step_on_device(gamma, plan.lookup ? &plan.match.drafts : nullptr, &emitted,
                                     logprobs, forward_done));
    const double step_seconds = seconds_since(t0);
    int n_accepted = int(emitted.size()) - 1;
    // Drafts after the first rejection are never judged: α counts only judged ones.
    int evaluated = std::min(n_accepted + 1, gamma);
    const auto end = config_.end_token >= 0
                         ? std::find(emitted.begin(), emitted.end(), config_.end_token)
                         : emitted.end();
    const bool ended = end != emitted.end();
    if (ended) {
        const int at = int(end - emitted.begin());
        if (at < n_accepted) n_accepted = evaluated = at + 1;  // an accepted draft ended it
        emitted.resize(size_t(at) + 1);
        if (logprobs != nullptr) logprobs->resize(logprobs_before + emitted.size());
    }
    commit(emitted);
    out->insert(out->end(), emitted.begin(), emitted.end());

    for (int c = 0; c < evaluated; ++c) {
        ++stats_.evaluated_at[size_t(c)];
        if (c < n_accepted) ++stats_.accepted_at[size_t(c)];
    }
    stats_.evaluated += uint64_t(evaluated);
    StepMeasurements& measured = current_measurements();
    if (plan.lookup) {
        measured.lookup_judged[size_t(plan.match.ngram)] += uint64_t(evaluated);
        measured.lookup_accepted[size_t(plan.match.ngram)] += uint64_t(n_accepted);
        stats_.lookup_drafted += uint64_t(gamma);
        stats_.lookup_accepted += uint64_t(n_accepted);
    } else {
        measured.judged += uint64_t(evaluated);
        measured.accepted += uint64_t(n_accepted);
    }
    measured.emitted += emitted.size();
    measured.ended += ended ? 1 : 0;
    stats_.drafted += uint64_t(gamma);
    stats_.accepted += uint64_t(n_accepted);
    stats_.emitted += emitted.size();
    stats_.last_gamma = gamma;
    ++stats_.steps;
    ++step_;
    // Each probe that plain decoding still wins after waits twice as long for the next; after
    // two costly probes in a row (costly_probe()) there is none in this sequence.
    if (config_.policy == GammaPolicy::kAnalytic && gamma > 0 && !plan.lookup) {
        const bool probe = plain_steps_ + 1 >= probe_every_;
        probe_every_ = probe ? std::min(2 * probe_every_, kMaxProbeEvery) : kProbeEvery;
        if (probe) {
            const bool costly = costly_probe(step_seconds, emitted.size(),
                                             measured.target_seconds[1], plain_steps_);
            costly_probes_ = costly ? costly_probes_ + 1 : 0;
            if (costly_probes_ >= 2) probe_every_ = kNeverProbe;
        }
    }
    if (gamma > 0 && !plan.lookup && measured.target_seconds[1] > 0)
        drafting_saved_ = std::max(
            drafting_saved_ + double(emitted.size()) * measured.target_seconds[1] - step_seconds,
            0.0);
    if (gamma > 0)
        (plan.lookup ? measured.realized_lookup : measured.realized_model)
            .add(double(emitted.size()), step_seconds_, RealizedRate::kSkipFirst);
    else if (!forward_done && (plain_steps_ > 0 || draft_ == nullptr))  // as step_on_device
        measured.realized_plain.add(double(emitted.size()), step_seconds_, 0,
                                    measured.target_samples[1] >= 2
                                        ? RealizedRate::kSlowPlainStep * measured.target_seconds[1]
                                        : 0.0);
    plain_steps_ = gamma == 0 ? plain_steps_ + 1 : 0;
    if (gamma > 0) ++measured.drafting_since_plain;
    adapt_gamma(n_accepted, gamma);
    return Status::Ok();
}

Status Generator::device_buffers(int n_vocab) {
    if (result_.buffer != nullptr) return Status::Ok();
    Backend& be = target_.backend();
    const int rows = max_drafts();
    draft_rows_ = {nullptr, 0, GgmlType::kF32, n_vocab, rows};
    result_ = {nullptr, 0, GgmlType::kI32, rows + 2, 1};
    lse_ = {nullptr, 0, GgmlType::kF32, rows + 1, 1};
    // The coupled acceptance's tokens: the target's γ + 1 draws, then each draft's (n, token).
    races_ = {nullptr, 0, GgmlType::kI32, rows + 1 + 2 * rows, 1};
    for (Tensor* t : {&draft_rows_, &result_, &lse_, &races_}) {
        std::unique_ptr<Buffer> b;
        SPECULA_TRY(be.allocate(t != &draft_rows_ || draft_ ? t->bytes() : 16, &b));
        t->buffer = b.get();
        buffers_.push_back(std::move(b));
    }
    // A draft with fewer ids puts no weight on the target's others: its rows are copied into
    // draft_rows_, whose columns past its vocabulary stay -infinity.
    if (draft_ != nullptr && draft_->n_vocab() < n_vocab) {
        const std::vector<float> tail(size_t(n_vocab - draft_->n_vocab()),
                                      -std::numeric_limits<float>::infinity());
        for (int r = 0; r < rows; ++r) {
            Tensor t = draft_rows_.row_range(r, 1);
            t.offset += size_t(draft_->n_vocab()) * sizeof(float);
            t.cols = int64_t(tail.size());
            be.upload(t, tail.data());
        }
    }
    return Status::Ok();
}

Tensor Generator::draft_row(int c) {
    Tensor logits = draft_->logits(1);
    if (draft_->n_vocab() >= target_.n_vocab()) {
        logits.cols = target_.n_vocab();  // the target's ids are the first ones
        return logits;
    }
    Tensor row = draft_rows_.row_range(c, 1);
    Tensor head = row;
    head.cols = draft_->n_vocab();
    target_.backend().copy(logits, head);
    return row;
}

// The whole step is recorded for the device and waited for once, when its n and
// tokens are read back (docs/DESIGN.md "Speculative decoding"): the draft samples each token on the
// device and writes it straight into the target's input ids, from where the next draft forward also
// reads it; the draft rows stay on the device for the verify passes.
Status Generator::step_on_device(int gamma, const std::vector<int32_t>* proposed,
                                 std::vector<int32_t>* emitted, std::vector<float>* logprobs,
                                 bool forward_done) {
    Backend& be = target_.backend();
    const int L = int(committed_.size());
    SPECULA_TRY(device_buffers(target_.n_vocab()));
    // Greedy compares argmaxes either way; proposals from the host are judged by the coupled
    // test when sampling (Config::lookup_ngram).
    const bool coupled =
        (config_.coupled || proposed != nullptr) && !config_.sampling.greedy() && gamma > 0;
    const int model_drafts = proposed != nullptr ? 0 : gamma;
    // races_ word of draft c's (0, token), after the target's draws
    const auto drafted_word = [&](int c) { return size_t(max_drafts() + 1 + 2 * c); };
    // Rows c of the step (the draft's c-th, the target's c-th) see the drafts before c.
    MaskArgs rules;
    if (masks_) {
        rules.program = *masks_;
        rules.state = MaskState::of(*masks_, std::span(committed_).subspan(masks_from_));
    }
    std::vector<float> unused;
    int draft_first = 0;  // the committed tokens the draft holds when the step's calls start
    int caught_up = 0;    // the missed tokens it evaluates in one forward before them
    if (model_drafts > 0) {
        SPECULA_TRY(draft_->prepare());
        // The draft is one or two committed tokens behind, which its first timed forward
        // below takes, or further after the prompt or plain steps: then all but the last are
        // evaluated before the step's clock starts (a gap longer than a batch closed first),
        // so every step with drafts, a probe after plain steps too, measures a draft call.
        draft_->truncate(L - 1);
        if (L - draft_->n_past() > draft_->max_batch())
            SPECULA_TRY(catch_up(*draft_, size_t(draft_->max_batch()), &unused));
        draft_first = draft_->n_past();
        be.upload(draft_->input_ids(0, L - draft_first),
                  committed_for(*draft_, size_t(draft_first), size_t(L)).data());
        if (L - draft_first > 2) {
            caught_up = L - draft_first - 1;
            be.mark_time(kCatchUpStart);
            SPECULA_TRY(draft_->record(draft_->input_ids(0, caught_up), false));
        }
    }
    if (!forward_done) SPECULA_TRY(catch_up(target_, 1, &unused));

    be.mark_time(kStepStart);
    if (proposed != nullptr) be.upload(target_.input_ids(1, gamma), proposed->data());
    for (int c = 0; c < model_drafts; ++c) {
        // Draft c - 1, or the committed tokens the draft has not evaluated.
        const Tensor ids =
            c > 0 ? target_.input_ids(c, 1)
                  : draft_->input_ids(draft_->n_past() - draft_first, L - draft_->n_past());
        SPECULA_TRY(draft_->record(ids, false));
        const Tensor q = draft_row(c);
        if (masks_) {
            rules.logits = q;
            rules.drafts = target_.input_ids(1, std::max(c, 1));
            rules.first_row = c;
            be.mask_logits(rules);
        }
        // Leviathan et al.'s test reads q again; the coupled acceptance only compares tokens.
        if (!config_.sampling.greedy() && !coupled && q.buffer != draft_rows_.buffer)
            be.copy(q, draft_rows_.row_range(c, 1));
        VerifyArgs sample;
        sample.target = q;
        sample.sampling = config_.sampling;
        sample.step = coupled ? 0 : step_;
        sample.stream = coupled ? RandomStream::kResidual : RandomStream::kDraft;
        sample.row_offset = coupled ? position_row(size_t(L + c)) : uint32_t(c);
        sample.token = target_.input_ids(c + 1, 1);
        if (coupled)
            sample.result = {races_.buffer, drafted_word(c) * sizeof(int32_t), GgmlType::kI32, 2,
                             1};
        be.verify(sample);
        if (c == 0) be.mark_time(kFirstDraftDone);
    }
    be.mark_time(kDraftsDone);
    if (!forward_done) {
        be.upload(target_.input_ids(0, 1), &committed_.back());
        SPECULA_TRY(target_.record(target_.input_ids(0, gamma + 1), true));
    }
    be.mark_time(kTargetDone);
    if (masks_) {
        rules.logits = target_.logits(gamma + 1);
        rules.drafts = target_.input_ids(1, std::max(gamma, 1));
        rules.first_row = 0;
        if (logprobs != nullptr) rules.log_sum_exp = lse_;
        be.mask_logits(rules);
    }
    VerifyArgs v;
    v.target = target_.logits(gamma + 1);
    v.sampling = config_.sampling;
    if (coupled) {
        // Each of the γ + 1 rows draws as plain decoding draws at its position (a batch of
        // one-row sequences); the drafts were drawn from q with the same noise.
        v.batch = gamma + 1;
        v.row_offset = position_row(size_t(L));
        v.token = races_;
        v.token.cols = gamma + 1;
    } else {
        v.draft = draft_rows_.row_range(0, std::max(gamma, 1));
        v.drafts = target_.input_ids(1, std::max(gamma, 1));
        v.gamma = gamma;
        // Plain decoding draws where the coupled acceptance would: the same text either way.
        v.step = gamma > 0 ? step_ : 0;
        v.row_offset = gamma > 0 ? 0 : position_row(size_t(L));
        v.result = result_;
    }
    be.verify(v);
    be.mark_time(kVerified);
    if (coupled) {
        std::vector<int32_t> races(size_t(races_.cols));
        SPECULA_TRY(be.download(races_, races.data()));  // the step's one wait
        const auto draft = [&](int c) {
            return proposed != nullptr ? (*proposed)[size_t(c)] : races[drafted_word(c) + 1];
        };
        int n = 0;
        while (n < gamma && races[size_t(n)] == draft(n))
            ++n;
        emitted->assign(races.begin(), races.begin() + n + 1);
    } else {
        std::vector<int32_t> result(size_t(result_.cols));
        SPECULA_TRY(be.download(result_, result.data()));  // the step's one wait
        emitted->assign(result.begin() + 1, result.begin() + 2 + result[0]);
    }
    const int n = int(emitted->size()) - 1;
    if (logprobs != nullptr) {  // reads of an idle device, after the step's wait
        std::vector<float> lse(size_t(lse_.cols));
        SPECULA_TRY(be.download(lse_, lse.data()));
        const Tensor rows = target_.logits(gamma + 1);
        for (int j = 0; j <= n; ++j) {
            Tensor z = rows.row_range(j, 1);
            z.offset += size_t((*emitted)[size_t(j)]) * sizeof(float);
            z.cols = 1;
            float logit = 0;
            SPECULA_TRY(be.download(z, &logit));
            logprobs->push_back(logit - lse[size_t(j)]);
        }
    }
    step_seconds_ = be.seconds_between(kStepStart, kVerified);
    stats_.draft_seconds += be.seconds_between(kStepStart, kDraftsDone);
    stats_.target_seconds += be.seconds_between(kDraftsDone, kTargetDone);
    stats_.verify_seconds += be.seconds_between(kTargetDone, kVerified);
    // The analytic policy's costs: the first draft call (of one or two tokens, as in a step
    // after a step with drafts) and the later ones apart (DraftCost), and a target call with
    // its verify pass, which sampling makes several rows long.
    StepMeasurements& m = current_measurements();
    if (model_drafts > 0)
        m.draft.first = updated_cost(m.draft.first, m.draft_first_samples++,
                                     be.seconds_between(kStepStart, kFirstDraftDone));
    if (model_drafts > 1)
        m.draft.next = updated_cost(m.draft.next, m.draft_next_samples++,
                                    be.seconds_between(kFirstDraftDone, kDraftsDone) / (gamma - 1));
    // A forward of a few tokens is priced by its fixed costs (launches, the weights' first read),
    // not by what a token adds.
    constexpr int kFewestCaughtUp = 8;
    if (caught_up >= kFewestCaughtUp)
        m.catch_up_token =
            updated_cost(m.catch_up_token, m.catch_up_samples++,
                         be.seconds_between(kCatchUpStart, kStepStart) / double(caught_up));
    // A plain step right after the prompt or after a step with drafts finds the draft's weights
    // in the caches, where the target's were (on the cpu, a model of 90 MB: 3 ms against 1.6
    // warm); plain decoding does not pay that, so only a plain step after a plain one measures it.
    // The lookup's proposals take no cache: without a draft model every step measures. A
    // forward shared with other sequences is not this sequence's cost.
    const auto width = size_t(gamma + 1);
    if (!forward_done && (gamma > 0 || plain_steps_ > 0 || draft_ == nullptr)) {
        m.target_seconds[width] = updated_cost(m.target_seconds[width], m.target_samples[width]++,
                                               be.seconds_between(kDraftsDone, kVerified));
        if (width == 1) m.drafting_since_plain = 0;
    }
    return Status::Ok();
}

// The non-exact sigmoid variant is a measurement tool: it verifies on the host.
Status Generator::sigmoid_step_on_host(int gamma, std::vector<int32_t>* emitted) {
    const int L = int(committed_.size());
    const auto V = size_t(target_.n_vocab());
    std::vector<int32_t> drafts;
    std::vector<float> draft_rows, logits;
    const auto step_start = Clock::now();
    auto t0 = step_start;
    draft_->truncate(L - 1);
    SPECULA_TRY(catch_up(*draft_, 0, &logits));  // the 1 or 2 committed tokens it has not seen
    for (int c = 0; c < gamma; ++c) {
        if (c > 0) SPECULA_TRY(draft_->forward(std::span(&drafts.back(), 1), false, &logits));
        // Over the target's ids (the draft's others never proposed, the target's it lacks 0).
        logits.resize(V, -std::numeric_limits<float>::infinity());
        draft_rows.insert(draft_rows.end(), logits.begin(), logits.end());
        drafts.push_back(draft_token(logits, config_.sampling, step_, uint32_t(c)));
    }
    stats_.draft_seconds += seconds_since(t0);
    t0 = Clock::now();
    SPECULA_TRY(catch_up(target_, 1, &logits));
    std::vector<int32_t> batch = {committed_.back()};
    batch.insert(batch.end(), drafts.begin(), drafts.end());
    std::vector<float> target_rows;
    SPECULA_TRY(target_.forward(batch, true, &target_rows));
    stats_.target_seconds += seconds_since(t0);
    t0 = Clock::now();
    const VerifyResult r = verify_sigmoid(target_rows, draft_rows, drafts, int(V), config_.sampling,
                                          config_.sigmoid_scale, step_);
    stats_.verify_seconds += seconds_since(t0);
    step_seconds_ = seconds_since(step_start);
    emitted->assign(drafts.begin(), drafts.begin() + r.n_accepted);
    emitted->push_back(r.token);
    return Status::Ok();
}

void Generator::forget(size_t n) {
    if (committed_.empty()) return;
    committed_.resize(committed_.size() - std::min(n, committed_.size() - 1));
    commit({});
}

void Generator::commit(std::span<const int32_t> tokens) {
    committed_.insert(committed_.end(), tokens.begin(), tokens.end());
    // Both caches keep every committed position but the last; anything they computed
    // beyond that (rejected drafts) is forgotten by moving the length back.
    const int keep = int(committed_.size()) - 1;
    target_.truncate(keep);
    if (draft_) draft_->truncate(keep);
    if (lookup_) lookup_->truncate(committed_.size());
}

}  // namespace specula
