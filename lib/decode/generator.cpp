#include "decode/generator.h"

#include <algorithm>
#include <cmath>

#include "decode/verify.h"

namespace specula {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

double expected_speedup(double alpha, double c, double gamma) {
    const double tokens =
        alpha >= 1.0 ? gamma + 1.0 : (1.0 - std::pow(alpha, gamma + 1.0)) / (1.0 - alpha);
    return tokens / (gamma * c + 1.0);
}

Generator::Generator(LlamaContext& target, LlamaContext* draft, const Config& config)
    : target_(target), draft_(draft), config_(config) {
    config_.gamma_max = std::clamp(config_.gamma_max, 1, kMaxGamma);
    config_.gamma = std::clamp(config_.gamma, 1, kMaxGamma);
    heuristic_gamma_ = config_.gamma;
}

void Generator::reset() {
    committed_.clear();
    target_.truncate(0);
    if (draft_) draft_->truncate(0);
    step_ = 0;
    heuristic_gamma_ = config_.gamma;
    target_call_seconds_ = draft_call_seconds_ = 0;
    stats_ = GeneratorStats{};
}

Status Generator::catch_up(LlamaContext& ctx, size_t keep, std::vector<float>* logits) {
    const size_t end = committed_.size() - std::min(keep, committed_.size());
    ctx.truncate(int(std::min(end, size_t(ctx.n_past()))));
    for (size_t i = size_t(ctx.n_past()); i < end; i += size_t(ctx.max_batch())) {
        const size_t n = std::min(end - i, size_t(ctx.max_batch()));
        SPECULA_TRY(ctx.forward(std::span(committed_).subspan(i, n), false, logits));
    }
    return Status::Ok();
}

Status Generator::append(std::span<const int32_t> tokens) {
    committed_.insert(committed_.end(), tokens.begin(), tokens.end());
    std::vector<float> logits;
    SPECULA_TRY(catch_up(target_, 1, &logits));
    if (draft_) SPECULA_TRY(catch_up(*draft_, 1, &logits));
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
            if (stats_.evaluated < 16 || target_call_seconds_ <= 0)
                return config_.gamma;  // not measured yet
            const double alpha =
                std::min(double(stats_.accepted) / double(stats_.evaluated), 0.999);
            const double c = draft_call_seconds_ / target_call_seconds_;
            int best = 1;
            for (int g = 2; g <= config_.gamma_max; ++g)
                if (expected_speedup(alpha, c, g) > expected_speedup(alpha, c, best)) best = g;
            return best;
        }
    }
    return config_.gamma;
}

void Generator::adapt_gamma(int n_accepted, int gamma) {
    if (gamma == 0) return;
    heuristic_gamma_ = n_accepted == gamma ? std::min(heuristic_gamma_ + 2, config_.gamma_max)
                                           : std::max(heuristic_gamma_ - 1, 1);
}

Status Generator::step(int max_tokens, std::vector<int32_t>* out) {
    if (committed_.empty()) return InvalidArgument("evaluate a prompt before generating");
    if (max_tokens < 1) return InvalidArgument("a step emits at least one token");
    const int L = int(committed_.size());
    if (L > target_.n_ctx())
        return {SPECULA_ERR_CONTEXT_FULL,
                "the context of " + std::to_string(target_.n_ctx()) + " tokens is full"};
    // γ drafts need γ more target positions (and γ - 1 more draft positions) after the last
    // committed token.
    int gamma = std::min({next_gamma(), max_tokens - 1, target_.n_ctx() - L});
    if (draft_) gamma = std::min(gamma, draft_->n_ctx() - L + 1);
    gamma = std::max(gamma, 0);
    const auto V = size_t(target_.model().config().n_vocab);

    std::vector<int32_t> drafts;
    std::vector<float> draft_rows, logits;
    if (gamma > 0) {
        const auto t0 = Clock::now();
        draft_->truncate(L - 1);
        SPECULA_TRY(catch_up(*draft_, 0, &logits));  // the 1 or 2 committed tokens it has not seen
        for (int c = 0; c < gamma; ++c) {
            if (c > 0) SPECULA_TRY(draft_->forward(std::span(&drafts.back(), 1), false, &logits));
            draft_rows.insert(draft_rows.end(), logits.begin(), logits.end());
            drafts.push_back(draft_token(logits, config_.sampling, step_, uint32_t(c)));
        }
        const double dt = seconds_since(t0);
        stats_.draft_seconds += dt;
        stats_.draft_calls += uint64_t(gamma);
        draft_call_seconds_ =
            draft_call_seconds_ > 0 ? 0.9 * draft_call_seconds_ + 0.1 * dt / gamma : dt / gamma;
    }

    const auto t1 = Clock::now();
    SPECULA_TRY(catch_up(target_, 1, &logits));
    std::vector<int32_t> batch = {committed_.back()};
    batch.insert(batch.end(), drafts.begin(), drafts.end());
    std::vector<float> target_rows;
    SPECULA_TRY(target_.forward(batch, true, &target_rows));
    const double dt = seconds_since(t1);
    stats_.target_seconds += dt;
    ++stats_.target_calls;
    target_call_seconds_ = target_call_seconds_ > 0 ? 0.9 * target_call_seconds_ + 0.1 * dt : dt;

    const auto t2 = Clock::now();
    const VerifyResult r =
        config_.sigmoid_verify
            ? verify_sigmoid(target_rows, draft_rows, drafts, int(V), config_.sampling,
                             config_.sigmoid_scale, step_)
            : verify(target_rows, draft_rows, drafts, int(V), config_.sampling, step_);
    stats_.verify_seconds += seconds_since(t2);

    std::vector<int32_t> emitted(drafts.begin(), drafts.begin() + r.n_accepted);
    emitted.push_back(r.token);
    commit(emitted);
    out->insert(out->end(), emitted.begin(), emitted.end());

    // Drafts after the first rejection are never judged: α counts only judged ones.
    const int evaluated = std::min(r.n_accepted + 1, gamma);
    for (int c = 0; c < evaluated; ++c) {
        ++stats_.evaluated_at[size_t(c)];
        if (c < r.n_accepted) ++stats_.accepted_at[size_t(c)];
    }
    stats_.evaluated += uint64_t(evaluated);
    stats_.drafted += uint64_t(gamma);
    stats_.accepted += uint64_t(r.n_accepted);
    stats_.emitted += emitted.size();
    stats_.last_gamma = gamma;
    ++stats_.steps;
    ++step_;
    adapt_gamma(r.n_accepted, gamma);
    return Status::Ok();
}

void Generator::commit(std::span<const int32_t> tokens) {
    committed_.insert(committed_.end(), tokens.begin(), tokens.end());
    // Both caches keep every committed position but the last; anything they computed
    // beyond that (rejected drafts) is forgotten by moving the length back.
    const int keep = int(committed_.size()) - 1;
    target_.truncate(keep);
    if (draft_) draft_->truncate(keep);
}

}  // namespace specula
