#include "audio/resample.h"

#include <samplerate.h>

#include <cmath>
#include <new>
#include <string>

namespace specula::audio {

namespace {
// libsamplerate's SRC_ERR_MALLOC_FAILED (its error enum is not in the public header).
constexpr int kSrcMallocFailed = 1;
}  // namespace

Status resample(std::span<const float> in, int from_rate, int to_rate, std::vector<float>* out) {
    if (from_rate <= 0 || to_rate <= 0)
        return InvalidArgument("sample rates must be positive (got " + std::to_string(from_rate) +
                               " Hz to " + std::to_string(to_rate) + " Hz)");
    const double ratio = double(to_rate) / double(from_rate);
    if (src_is_valid_ratio(ratio) == 0)
        return InvalidArgument("cannot resample " + std::to_string(from_rate) + " Hz to " +
                               std::to_string(to_rate) + " Hz: more than a factor of 256");
    try {
        if (from_rate == to_rate || in.empty()) {
            out->assign(in.begin(), in.end());
            return Status::Ok();
        }
        // src_simple reads long frame counts; one more than the exact length lets it finish.
        const auto frames = long(std::ceil(double(in.size()) * ratio)) + 1;
        out->resize(size_t(frames));
        SRC_DATA data{};
        data.data_in = in.data();
        data.input_frames = long(in.size());
        data.data_out = out->data();
        data.output_frames = frames;
        data.src_ratio = ratio;
        if (const int e = src_simple(&data, SRC_SINC_BEST_QUALITY, 1); e != 0)
            return e == kSrcMallocFailed
                       ? OutOfMemory("resampling: " + std::string(src_strerror(e)))
                       : InvalidArgument("resampling: " + std::string(src_strerror(e)));
        out->resize(size_t(data.output_frames_gen));
    } catch (const std::bad_alloc&) {
        return OutOfMemory("resampling " + std::to_string(in.size()) + " samples");
    }
    return Status::Ok();
}

}  // namespace specula::audio

namespace specula::audio {

Status StreamResampler::create(int from_rate, int to_rate, std::unique_ptr<StreamResampler>* out) {
    std::vector<float> none;
    SPECULA_TRY(resample({}, from_rate, to_rate, &none));  // the rates' checks
    std::unique_ptr<StreamResampler> r(new (std::nothrow) StreamResampler);
    if (r == nullptr) return OutOfMemory("a resampler");
    r->from_ = from_rate;
    r->to_ = to_rate;
    if (from_rate != to_rate) {
        int e = 0;
        r->state_ = src_new(SRC_SINC_BEST_QUALITY, 1, &e);
        if (r->state_ == nullptr) return OutOfMemory("resampling: " + std::string(src_strerror(e)));
    }
    *out = std::move(r);
    return Status::Ok();
}

StreamResampler::~StreamResampler() {
    if (state_ != nullptr) src_delete(static_cast<SRC_STATE*>(state_));
}

Status StreamResampler::push(std::span<const float> in, bool last, std::vector<float>* out) {
    try {
        if (state_ == nullptr) {
            out->insert(out->end(), in.begin(), in.end());
            return Status::Ok();
        }
        const double ratio = double(to_) / double(from_);
        std::vector<float> buffer(size_t(std::ceil(double(in.size()) * ratio)) + 4096);
        SRC_DATA data{};
        // libsamplerate flushes nothing from a null input pointer, even at the end.
        static constexpr float kNothing = 0.0f;
        data.data_in = in.empty() ? &kNothing : in.data();
        data.input_frames = long(in.size());
        data.src_ratio = ratio;
        data.end_of_input = last ? 1 : 0;
        // libsamplerate may hold input back or, at the end, emit more than one buffer holds.
        for (;;) {
            data.data_out = buffer.data();
            data.output_frames = long(buffer.size());
            if (const int e = src_process(static_cast<SRC_STATE*>(state_), &data); e != 0)
                return InvalidArgument("resampling: " + std::string(src_strerror(e)));
            out->insert(out->end(), buffer.begin(), buffer.begin() + data.output_frames_gen);
            if (data.input_frames_used == 0 && data.output_frames_gen == 0) break;
            data.data_in += data.input_frames_used;
            data.input_frames -= data.input_frames_used;
            if (data.input_frames == 0 && (!last || data.output_frames_gen == 0)) break;
        }
    } catch (const std::bad_alloc&) {
        return OutOfMemory("resampling " + std::to_string(in.size()) + " samples");
    }
    return Status::Ok();
}

}  // namespace specula::audio
