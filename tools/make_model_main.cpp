// specula-make-model: a Llama GGUF with random weights, for tests and benchmarks.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <thread>

#include "model_maker.h"

int main(int argc, char** argv) {
    specula::RandomLlamaSpec spec;
    std::string out, type = "q8_0";
    CLI::App app{"Write a Llama GGUF with random weights and a real tokenizer"};
    app.add_option("--vocab", spec.vocab_path, "GGUF file whose tokenizer.* metadata is copied")
        ->required();
    app.add_option("-o,--output", out, "output GGUF path")->required();
    app.add_option("--n-embd", spec.n_embd);
    app.add_option("--n-layer", spec.n_layer);
    app.add_option("--n-head", spec.n_head);
    app.add_option("--n-head-kv", spec.n_head_kv);
    app.add_option("--n-ff", spec.n_ff);
    app.add_option("--n-ctx", spec.n_ctx);
    app.add_option("--n-vocab", spec.n_vocab, "truncate the vocabulary (0 keeps all)");
    app.add_option("--type", type,
                   "weight type: f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k "
                   "(K-quants: widths multiples of 256)");
    app.add_option("--seed", spec.seed);
    app.add_option("--name", spec.name);
    app.add_flag("--tied", spec.tied_output, "share token_embd as the output head");
    app.add_option(
        "--arch", spec.arch,
        "llama, qwen2 (q/k/v biases, NeoX rotation), qwen3 (q/k head norms, NeoX), phi3 "
        "(fused q/k/v and gate/up tensors, NeoX), gemma3 (GeGLU, post-norms, q/k head norms, "
        "local and global layers), gemma2 (GeGLU, post-norms, soft caps, local and global "
        "layers) or granite (Llama's with scaled embeddings, residual updates, attention and "
        "logits)");
    app.add_option("--head-dim", spec.head_dim, "head width (0: n_embd / n_head)");
    app.add_option("--n-rot", spec.n_rot, "rotated dimensions of a head (0: all)");
    app.add_flag(
        "--longrope", spec.longrope,
        "phi3: LongRoPE factors (short up to n_ctx / 4, long beyond) and attention factor");
    app.add_option("--sliding-window", spec.sliding_window,
                   "phi3: the sliding window (0: n_ctx); gemma3, gemma2: the local layers' "
                   "(0: 512, 4096)");
    app.add_option("--attn-soft-cap", spec.attn_soft_cap, "gemma2: attention scores' soft cap");
    app.add_option("--final-soft-cap", spec.final_soft_cap, "gemma2: the logits' soft cap");
    app.add_option("--embedding-scale", spec.embedding_scale, "granite: the embeddings' scale");
    app.add_option("--residual-scale", spec.residual_scale, "granite: the residual updates' scale");
    app.add_option("--attention-scale", spec.attention_scale, "granite: q . k's scale");
    app.add_option("--logit-scale", spec.logit_scale, "granite: the logits are divided by it");
    app.add_option("--rope-scale", spec.rope_scale, "linear rope scaling by this factor");
    app.add_flag("--llama3-rope", spec.llama3_rope,
                 "Llama 3.2's rope scaling, as a rope_freqs tensor of per-pair factors");
    std::string shape;
    app.add_option("--shape", shape,
                   "a released model's shape, which the other options change: llama3.2-1b, "
                   "llama3.2-3b, llama3.1-8b, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b, qwen2.5-7b, "
                   "phi3.5-mini, gemma3-270m, gemma3-1b, gemma2-2b, granite3.1-2b");
    app.add_option("--head-scale", spec.head_scale,
                   "the output head's logits have about this standard deviation (how peaked "
                   "the distributions are; 0: 4 for a separate head, the embedding's for a tied "
                   "one)");
    app.add_flag("--successor-head", spec.successor_head,
                 "the head's row for pi(x) is the embedding's row x, for a random cycle pi through "
                 "the vocabulary (untied): greedy text steps through new tokens instead of "
                 "repeating one (a benchmark device)");
    app.add_option("--draft-output", spec.draft_path,
                   "also write a draft: the target's first --draft-layers layers, embedding and "
                   "head (a benchmark device with a dialled acceptance rate, not a model)");
    app.add_option("--draft-layers", spec.draft_layers, "the draft's layers");
    app.add_option("--late-scale", spec.late_scale,
                   "the target's layers after the draft's add their outputs scaled by this: 0 "
                   "makes target and draft the same function, larger values lower the "
                   "acceptance rate");
    CLI11_PARSE(app, argc, argv);
    specula::Status s = specula::Status::Ok();
    if (!shape.empty()) {
        // The shape's values, then the options given again: those on the command line win.
        s = specula::apply_released_shape(shape, &spec);
        if (s.ok()) CLI11_PARSE(app, argc, argv);
    }
    if (s.ok()) s = specula::parse_weight_type(type, &spec.weight_type);
    spec.threads = int(std::max(1u, std::thread::hardware_concurrency()));
    if (s.ok()) s = specula::write_random_llama(spec, out);
    if (!s.ok()) {
        std::fprintf(stderr, "specula-make-model: %s\n", s.message().c_str());
        return 1;
    }
    return 0;
}
