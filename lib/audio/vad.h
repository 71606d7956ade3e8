// Voice activity detection for live transcription (host side): WebRTC's VAD (a Gaussian
// mixture over six sub-band energies, tuned on telephone and conference speech), reached through
// Debian's libwebrtc-audio-processing, whose public AudioProcessing interface carries it as its
// VoiceDetection component. It judges 10 ms frames of 16 kHz audio as voiced or not.
#pragma once

#include <memory>
#include <span>

#include "core/status.h"

namespace webrtc {
class AudioProcessing;
}

namespace specula::audio {

class VoiceDetector {
  public:
    static constexpr int kFrameSamples = 160;  // 10 ms at 16 kHz

    // aggressiveness 0 (keeps the most audio as voice) .. 3 (the least); else
    // SPECULA_ERR_INVALID_ARGUMENT.
    static Status create(int aggressiveness, std::unique_ptr<VoiceDetector>* out);
    ~VoiceDetector();
    VoiceDetector(const VoiceDetector&) = delete;
    VoiceDetector& operator=(const VoiceDetector&) = delete;

    // Whether a frame of samples in [-1, 1] (clipped beyond) holds voice.
    Status voiced(std::span<const float, kFrameSamples> frame, bool* out);

  private:
    VoiceDetector() = default;
    std::unique_ptr<webrtc::AudioProcessing> apm_;
};

}  // namespace specula::audio
