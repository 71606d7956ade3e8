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
