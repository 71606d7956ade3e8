// Runs a Whisper model on raw float32 samples (16 kHz mono) and writes, as raw float32, the
// encoder's output and the decoder's logits of every token (fed in two forwards, so that the
// second reads the first's cache): the Whisper parity test's input.
// Usage: specula-dump-whisper model.bin samples.f32 cpu|vulkan|cuda enc.f32 logits.f32 token...
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "audio/mel.h"
#include "backend/backend.h"
#include "backend/factory.h"
#include "models/whisper.h"

using namespace specula;

namespace {

bool write_floats(const char* path, const std::vector<float>& v) {
    std::ofstream o(path, std::ios::binary);
    o.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
    return o.good();
}

int fail(const Status& s) {
    std::fprintf(stderr, "specula-dump-whisper: %s\n", s.message().c_str());
    return 1;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 7) {
        std::fprintf(stderr,
                     "usage: %s model.bin samples.f32 backend enc.f32 logits.f32 token...\n",
                     argv[0]);
        return 2;
    }
    std::vector<float> samples;
    {
        std::ifstream f(argv[2], std::ios::binary | std::ios::ate);
        samples.resize(size_t(f.tellg()) / sizeof(float));
        f.seekg(0);
        f.read(reinterpret_cast<char*>(samples.data()), std::streamsize(samples.size() * 4));
        if (!f) return fail(IoError(std::string("cannot read ") + argv[2]));
    }
    specula_backend_params bp = specula_backend_default_params();
    if (specula_backend_kind_from_name(argv[3], &bp.kind) != SPECULA_OK)
        return fail(InvalidArgument(std::string("unknown backend ") + argv[3]));
    std::unique_ptr<Backend> backend;
    Status s = create_backend(bp, &backend);
    if (s.code() == SPECULA_ERR_NO_DEVICE) {
        std::fprintf(stderr, "specula-dump-whisper: skipped: %s\n", s.message().c_str());
        return 77;
    }
    if (!s.ok()) return fail(s);
    std::unique_ptr<MappedFile> file;
    std::unique_ptr<WhisperModel> model;
    std::unique_ptr<WhisperContext> ctx;
    std::vector<int32_t> tokens;
    for (int i = 6; i < argc; ++i)
        tokens.push_back(std::atoi(argv[i]));
    audio::LogMel mel;
    if (s.ok()) s = MappedFile::open(argv[1], &file);
    if (s.ok()) s = WhisperModel::load(*backend, std::move(file), nullptr, &model);
    if (s.ok()) s = WhisperContext::create(*model, int(tokens.size()), &ctx);
    if (s.ok()) s = audio::log_mel(samples, model->mel_filters(), &mel);
    if (s.ok()) s = ctx->encode(mel, 0);
    std::vector<float> enc, logits, more;
    if (s.ok()) {
        const Tensor out = ctx->encoder_output();
        enc.resize(size_t(out.cols * out.rows));
        s = backend->download(out, enc.data());
    }
    const size_t half = tokens.size() / 2;
    if (s.ok()) s = ctx->forward(std::span(tokens).first(half), true, &logits);
    if (s.ok()) s = ctx->forward(std::span(tokens).subspan(half), true, &more);
    if (!s.ok()) return fail(s);
    logits.insert(logits.end(), more.begin(), more.end());
    if (!write_floats(argv[4], enc) || !write_floats(argv[5], logits))
        return fail(IoError("cannot write the outputs"));
    return 0;
}
