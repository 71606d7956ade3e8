// specula-make-whisper: a whisper.cpp model file with random weights in a released shape, for
// tests and benchmarks.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <thread>

#include "model_maker.h"

int main(int argc, char** argv) {
    specula::RandomWhisperSpec spec;
    std::string out, shape = "tiny", type = "f16";
    bool english = false;
    int n_audio_ctx = 0, n_text_ctx = 0, n_vocab = 0, width = 0, heads = 0, layers = 0, n_mels = 0;
    int encoder_layers = 0, decoder_layers = 0;
    CLI::App app{"Write a whisper.cpp model file with random weights"};
    app.add_option("--header", spec.header_path,
                   "whisper.cpp model file whose mel filters and vocabulary are copied "
                   "(e.g. for-tests-ggml-tiny.bin)");
    app.add_option("-o,--output", out, "output path")->required();
    app.add_option("--shape", shape, "tiny, base, small, medium, large (large-v2's) or large-v3");
    app.add_flag("--en", english, "the English-only vocabulary (51864 tokens)");
    app.add_option("--type", type, "matrix type: f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1");
    app.add_option("--n-audio-ctx", n_audio_ctx, "encoder positions (default 1500)");
    // Smaller than any released shape: fuzzing seeds and quick tests (without --header).
    app.add_option("--n-text-ctx", n_text_ctx, "decoder positions (default 448)");
    app.add_option("--n-vocab", n_vocab, "tokens");
    app.add_option("--width", width, "model width (encoder and decoder)");
    app.add_option("--heads", heads, "attention heads (encoder and decoder)");
    app.add_option("--layers", layers, "blocks (encoder and decoder)");
    app.add_option("--encoder-layers", encoder_layers, "encoder blocks (after --layers)");
    app.add_option("--decoder-layers", decoder_layers, "decoder blocks (after --layers)");
    app.add_option("--n-mels", n_mels, "mel bands");
    app.add_option("--seed", spec.seed);
    // A benchmark device for speculative transcription, not a model (tools/model_maker.h).
    app.add_option("--draft-output", spec.draft_path,
                   "also write a Distil-Whisper-shaped draft: the target's encoder, its first "
                   "decoder blocks and its last");
    app.add_option("--draft-decoder-layers", spec.draft_decoder_layers,
                   "the draft's decoder blocks (default 2)");
    std::string draft_type;
    app.add_option("--draft-type", draft_type,
                   "the draft's matrix type (default the target's): its encoder is then the "
                   "target's rounded to it");
    app.add_option("--head-scale", spec.head_scale,
                   "the logits about this wide (the token embedding drawn wider), as a trained "
                   "model's are peaked");
    app.add_option("--late-scale", spec.late_scale,
                   "the target's other decoder blocks add their outputs scaled by this (0: the "
                   "draft is the target's function; larger: they agree less)");
    app.add_option("--position-scale", spec.position_scale,
                   "the decoder's positional embedding this many times a block's output: the "
                   "text follows the positions and does not fall into loops (0: as trained "
                   "models are initialized)");
    CLI11_PARSE(app, argc, argv);
    specula::Status s = specula::whisper_shape(shape, english, &spec.hparams);
    specula::WhisperHparams& h = spec.hparams;
    for (auto [value, field] : {std::pair{n_audio_ctx, &h.n_audio_ctx},
                                {n_text_ctx, &h.n_text_ctx},
                                {n_vocab, &h.n_vocab},
                                {width, &h.n_audio_state},
                                {width, &h.n_text_state},
                                {heads, &h.n_audio_head},
                                {heads, &h.n_text_head},
                                {layers, &h.n_audio_layer},
                                {layers, &h.n_text_layer},
                                {encoder_layers, &h.n_audio_layer},
                                {decoder_layers, &h.n_text_layer},
                                {n_mels, &h.n_mels}})
        if (value > 0) *field = value;
    if (s.ok()) s = specula::parse_weight_type(type, &spec.weight_type);
    if (s.ok() && !draft_type.empty()) {
        specula::GgmlType t{};
        s = specula::parse_weight_type(draft_type, &t);
        spec.draft_weight_type = t;
    }
    spec.threads = int(std::max(1u, std::thread::hardware_concurrency()));
    if (s.ok()) s = specula::write_random_whisper(spec, out);
    if (!s.ok()) {
        std::fprintf(stderr, "specula-make-whisper: %s\n", s.message().c_str());
        return 1;
    }
    return 0;
}
