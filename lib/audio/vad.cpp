#include "audio/vad.h"

#include <webrtc/modules/audio_processing/include/audio_processing.h>
#include <webrtc/modules/interface/module_common_types.h>

#include <algorithm>
#include <cmath>
#include <new>
#include <string>

namespace specula::audio {

VoiceDetector::~VoiceDetector() = default;

Status VoiceDetector::create(int aggressiveness, std::unique_ptr<VoiceDetector>* out) {
    using Likelihood = webrtc::VoiceDetection::Likelihood;
    // The component names its modes by how likely a frame is to be declared voice; 3 - that is
    // WebRTC's own aggressiveness (webrtc_vad.h's modes 0..3).
    constexpr Likelihood kByAggressiveness[] = {
        webrtc::VoiceDetection::kHighLikelihood, webrtc::VoiceDetection::kModerateLikelihood,
        webrtc::VoiceDetection::kLowLikelihood, webrtc::VoiceDetection::kVeryLowLikelihood};
    if (aggressiveness < 0 || aggressiveness > 3)
        return InvalidArgument("voice detection aggressiveness must be 0..3 (got " +
                               std::to_string(aggressiveness) + ")");
    std::unique_ptr<VoiceDetector> v(new (std::nothrow) VoiceDetector);
    if (v == nullptr) return OutOfMemory("a voice detector");
    v->apm_.reset(webrtc::AudioProcessing::Create());
    if (v->apm_ == nullptr) return OutOfMemory("WebRTC's audio processing");
    webrtc::VoiceDetection* d = v->apm_->voice_detection();
    if (d->Enable(true) != 0 || d->set_likelihood(kByAggressiveness[aggressiveness]) != 0 ||
        d->set_frame_size_ms(10) != 0)
        return Status(SPECULA_ERR_INTERNAL, "WebRTC's voice detection refused its settings");
    *out = std::move(v);
    return Status::Ok();
}

Status VoiceDetector::voiced(std::span<const float, kFrameSamples> frame, bool* out) {
    webrtc::AudioFrame f;
    f.sample_rate_hz_ = 16000;
    f.num_channels_ = 1;
    f.samples_per_channel_ = kFrameSamples;
    for (int i = 0; i < kFrameSamples; ++i) {
        const float x = std::isfinite(frame[size_t(i)]) ? frame[size_t(i)] : 0.0f;
        f.data_[i] = int16_t(std::lround(std::clamp(x, -1.0f, 1.0f) * 32767.0f));
    }
    if (const int e = apm_->ProcessStream(&f); e != 0)
        return Status(SPECULA_ERR_INTERNAL,
                      "WebRTC's audio processing failed a frame (error " + std::to_string(e) + ")");
    *out = apm_->voice_detection()->stream_has_voice();
    return Status::Ok();
}

}  // namespace specula::audio
