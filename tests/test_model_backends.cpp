// The whole Llama model on each GPU backend against the cpu reference:
// logits parity per weight type, batch invariance on the device, greedy
// generation token for token, one host wait per forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend_util.h"
#include "format/quant.h"
#include "models/llama.h"
#include "specula.h"
#include "test_util.h"

using namespace specula;

namespace {

const bool kCpuFloatInputs = test::compare_gpus_with_float_inputs_on_the_cpu();

std::string model_file(GgmlType type) {
    return test::make_model(std::string("backends-") + ggml_type_name(type),
                            test::small_spec(type, 11));
}

const std::vector<int32_t> kTokens = {1, 15043, 3186, 29892, 920, 526, 366, 29973, 306, 626};

struct Case {
    specula_backend_kind kind;
    GgmlType type;
};

class ModelOnBackend : public ::testing::TestWithParam<Case> {};

TEST_P(ModelOnBackend, LogitsMatchTheCpu) {
    SPECULA_BACKEND_OR_SKIP(gpu, GetParam().kind);
    // Where the gpu multiplies 8-bit inputs, so does the cpu: the same rounding of the same
    // floats. The activations still differ by their sums' order, and an input that lies on a
    // rounding boundary can go either way: one quantum of one input (a 127th of its block's
    // largest) moves the logits by ~1e-3 of their largest, hence the wider tolerance.
    const bool int_inputs = gpu->quantizes_inputs(GetParam().type, int64_t(kTokens.size()));
    auto cpu =
        create_cpu_backend(2, test::with_path(&specula_backend_options::int8_inputs, int_inputs));
    const double tolerance = int_inputs ? 4e-3 : 1e-4;
    const std::string path = model_file(GetParam().type);
    auto mg = test::load_llama(*gpu, path), mc = test::load_llama(*cpu, path);
    std::unique_ptr<LlamaContext> cg, cc;
    ASSERT_TRUE(LlamaContext::create(*mg, 64, 16, &cg).ok());
    ASSERT_TRUE(LlamaContext::create(*mc, 64, 16, &cc).ok());
    std::vector<float> lg, lc;
    ASSERT_TRUE(cg->forward(kTokens, true, &lg).ok());
    ASSERT_TRUE(cc->forward(kTokens, true, &lc).ok());
    double max_ref = 0, max_err = 0;
    for (size_t i = 0; i < lc.size(); ++i) {
        max_ref = std::max(max_ref, double(std::fabs(lc[i])));
        max_err = std::max(max_err, double(std::fabs(lc[i] - lg[i])));
    }
    EXPECT_LE(max_err, tolerance * max_ref)
        << "max |gpu - cpu| " << max_err << " of max |cpu| " << max_ref;
}

// docs/DESIGN.md "Batch invariance" on the device: a position's logits are bit-identical alone and
// in a batch.
TEST_P(ModelOnBackend, BatchInvariance) {
    SPECULA_BACKEND_OR_SKIP(gpu, GetParam().kind);
    auto m = test::load_llama(*gpu, model_file(GetParam().type));
    constexpr int kWidest = SPECULA_MAX_GAMMA + 1;  // the last token and every draft
    std::vector<int32_t> tokens(2 + kWidest);
    for (size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = kTokens[i % kTokens.size()] + int32_t(i);
    const size_t n_vocab = size_t(m->config().n_vocab);
    std::unique_ptr<LlamaContext> one;
    ASSERT_TRUE(LlamaContext::create(*m, 64, kWidest, &one).ok());
    std::vector<float> sequential, logits;
    for (int32_t t : tokens) {
        ASSERT_TRUE(one->forward(std::span(&t, 1), true, &logits).ok());
        sequential.insert(sequential.end(), logits.begin(), logits.end());
    }
    // A prefix of 2, then a verification batch of 8, or the widest one.
    for (int width : {8, kWidest}) {
        SCOPED_TRACE("batch of " + std::to_string(width));
        const auto used = std::span(tokens).first(size_t(2 + width));
        std::unique_ptr<LlamaContext> batch;
        ASSERT_TRUE(LlamaContext::create(*m, 64, kWidest, &batch).ok());
        std::vector<float> head, tail;
        ASSERT_TRUE(batch->forward(used.first(2), true, &head).ok());
        ASSERT_TRUE(batch->forward(used.subspan(2), true, &tail).ok());
        head.insert(head.end(), tail.begin(), tail.end());
        ASSERT_EQ(head.size(), used.size() * n_vocab);
        EXPECT_EQ(std::memcmp(head.data(), sequential.data(), head.size() * sizeof(float)), 0);
    }
}

std::vector<specula_backend_kind> gpu_kinds() {
    return {SPECULA_BACKEND_VULKAN, SPECULA_BACKEND_CUDA};
}

std::vector<Case> cases() {
    std::vector<Case> c;
    for (auto k : gpu_kinds())
        for (auto t : kWeightTypes)
            c.push_back({k, t});
    return c;
}

INSTANTIATE_TEST_SUITE_P(Gpu, ModelOnBackend, ::testing::ValuesIn(cases()), [](const auto& info) {
    return std::string(test::backend_name(info.param.kind)) + "_" + ggml_type_name(info.param.type);
});

// A tensor of a GGUF type no backend computes with (BF16: the file is otherwise an F16 model,
// the same bytes) is refused at load on every backend, naming the tensor and the type.
TEST(ModelLoad, ATypeWithoutKernelsIsRefusedByName) {
    std::vector<char> bytes = test::read_file_bytes(model_file(GgmlType::kF16));
    const std::string name = "token_embd.weight";
    auto at = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
    ASSERT_NE(at, bytes.end());
    // After the name: the rank (uint32), the dimensions (uint64 each), the type (uint32).
    const size_t type_at = size_t(at - bytes.begin()) + name.size() + 4 + 2 * 8;
    uint32_t type = 0;
    std::memcpy(&type, &bytes[type_at], 4);
    ASSERT_EQ(type, uint32_t(GgmlType::kF16));
    type = uint32_t(GgmlType::kBF16);
    std::memcpy(&bytes[type_at], &type, 4);
    for (auto kind : {SPECULA_BACKEND_CPU, SPECULA_BACKEND_VULKAN, SPECULA_BACKEND_CUDA}) {
        std::string why;
        auto backend = test::try_backend(kind, &why);
        if (!backend) continue;
        SCOPED_TRACE(test::backend_name(kind));
        std::unique_ptr<LlamaModel> m;
        const Status s = LlamaModel::load(
            *backend,
            MappedFile::copy_of({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}),
            nullptr, &m);
        EXPECT_EQ(s.code(), SPECULA_ERR_UNSUPPORTED);
        EXPECT_NE(s.message().find("tensor 'token_embd.weight' has type BF16"), std::string::npos)
            << s.message();
    }
}

#ifdef SPECULA_HAVE_VULKAN
// A weight larger than the device's storage-buffer range is held in parts of whole rows, each
// bound on its own (llvmpipe's range is 128 MB: a real 1B model's token table exceeds it). A
// range forced small splits this model's token table and output into parts: every logit is the
// one-part model's, bit for bit, alone and in batches (the sliced and the tiled matmul).
TEST(VulkanWeightParts, AWeightInPartsGivesTheSameLogits) {
    std::string why;
    std::unique_ptr<Backend> whole = test::try_backend(SPECULA_BACKEND_VULKAN, &why);
    if (!whole) GTEST_SKIP() << why;
    specula_backend_options small_range{};
    small_range.max_binding_bytes = 1000000;
    std::unique_ptr<Backend> parts = test::try_backend(SPECULA_BACKEND_VULKAN, &why, small_range);
    ASSERT_TRUE(parts) << why;
    {
        const std::string path = model_file(GgmlType::kQ8_0);
        auto a = test::load_llama(*whole, path), b = test::load_llama(*parts, path);
        std::vector<int32_t> tokens(24);
        for (size_t i = 0; i < tokens.size(); ++i)
            tokens[i] = kTokens[i % kTokens.size()] + int32_t(i);
        for (size_t n : {size_t(1), size_t(5), tokens.size()}) {
            std::unique_ptr<LlamaContext> ca, cb;
            ASSERT_TRUE(LlamaContext::create(*a, 64, 24, &ca).ok());
            ASSERT_TRUE(LlamaContext::create(*b, 64, 24, &cb).ok());
            std::vector<float> la, lb;
            ASSERT_TRUE(ca->forward(std::span(tokens).first(n), true, &la).ok());
            const Status s = cb->forward(std::span(tokens).first(n), true, &lb);
            ASSERT_TRUE(s.ok()) << s.message();
            ASSERT_EQ(la.size(), lb.size());
            EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << n;
        }
    }
}
#endif

// Greedy generation through the C API: the same 64 tokens as the cpu, one host wait per forward.
class GenerateOnBackend : public ::testing::TestWithParam<specula_backend_kind> {};

std::vector<int32_t> greedy(specula_backend_kind kind, const std::string& path,
                            specula_session_stats* stats, specula_status* status,
                            bool from_memory = false) {
    specula_backend_params bp = specula_backend_default_params();
    bp.kind = kind;
    specula_backend* backend = nullptr;
    specula_model* model = nullptr;
    specula_session* session = nullptr;
    std::vector<int32_t> out(64);
    size_t n = 0;
    specula_session_params sp = specula_session_default_params();
    sp.temperature = 0.0f;
    sp.n_ctx = 128;
    specula_generate_params gp = specula_generate_default_params();
    gp.max_tokens = 64;
    gp.stop_at_eos = false;
    *status = specula_backend_create(&bp, &backend);
    if (*status == SPECULA_OK && from_memory) {
        std::vector<char> bytes = test::read_file_bytes(path);  // freed before generating
        *status =
            specula_model_load_from_memory(backend, bytes.data(), bytes.size(), nullptr, &model);
    } else if (*status == SPECULA_OK) {
        *status = specula_model_load(backend, path.c_str(), nullptr, &model);
    }
    if (*status == SPECULA_OK) *status = specula_session_create(model, &sp, &session);
    if (*status == SPECULA_OK) *status = specula_session_eval(session, kTokens.data(), 4);
    if (*status == SPECULA_OK) *status = specula_generate(session, &gp, out.data(), out.size(), &n);
    if (*status == SPECULA_OK) *status = specula_session_get_stats(session, stats);
    specula_session_free(session);
    specula_model_free(model);
    specula_backend_free(backend);
    out.resize(n);
    return out;
}

TEST_P(GenerateOnBackend, Greedy64TokensMatchTheCpu) {
    SPECULA_BACKEND_OR_SKIP(probe, GetParam());
    // The cpu multiplies 8-bit inputs where the gpu does (SPECULA_CPU_FLOAT_INPUTS, which the
    // C API's cpu backend reads, is 1 in these tests otherwise).
    const bool int_inputs = probe->quantizes_inputs(GgmlType::kQ8_0, 1);
    probe.reset();
    const std::string path = model_file(GgmlType::kQ8_0);
    specula_session_stats sg{}, sc{};
    specula_status s = SPECULA_OK;
    const auto tokens_gpu = greedy(GetParam(), path, &sg, &s);
    ASSERT_EQ(s, SPECULA_OK) << specula_last_error();
    const auto tokens_cpu = [&] {
        const test::ScopedEnv inputs("SPECULA_CPU_FLOAT_INPUTS", int_inputs ? "0" : "1");
        return greedy(SPECULA_BACKEND_CPU, path, &sc, &s);
    }();
    ASSERT_EQ(s, SPECULA_OK) << specula_last_error();
    ASSERT_EQ(tokens_gpu.size(), 64u);
    EXPECT_EQ(tokens_gpu, tokens_cpu);
    EXPECT_EQ(sg.n_forward_calls, 1 + 64u);  // the prompt but its last token, then one per token
    EXPECT_EQ(sg.n_host_waits, sg.n_forward_calls);
}

// A model loaded from a buffer (the buffer freed at once) generates what the file gives, on the
// same backend.
TEST_P(GenerateOnBackend, AModelLoadedFromMemoryMatchesTheFile) {
    SPECULA_BACKEND_OR_SKIP(probe, GetParam());
    probe.reset();
    const std::string path = model_file(GgmlType::kQ4_0);
    specula_session_stats st{};
    specula_status s = SPECULA_OK;
    const auto from_memory = greedy(GetParam(), path, &st, &s, true);
    ASSERT_EQ(s, SPECULA_OK) << specula_last_error();
    const auto from_file = greedy(GetParam(), path, &st, &s);
    ASSERT_EQ(s, SPECULA_OK) << specula_last_error();
    EXPECT_EQ(from_memory, from_file);
}

INSTANTIATE_TEST_SUITE_P(Gpu, GenerateOnBackend, ::testing::ValuesIn(gpu_kinds()),
                         [](const auto& info) {
                             return std::string(test::backend_name(info.param));
                         });

}  // namespace
