// specula-bench-verify: the cost of one speculative verification on a backend,
// three ways, measured side by side in one run:
//   tiled        Backend::verify, the passes of backend/vulkan/shaders/decode.comp; one host wait
//                to read n and the tokens (wall µs, and device µs from timestamps)
//   multi        the multi-dispatch baseline (full softmax rows of both models,
//                ratios, host readback of the acceptances, residual row,
//                normalisation, inverse-CDF sample): two host waits
//   readback     the logits rows copied to the host and verified there by the cpu
//                reference (sampling/verify.cpp)
// Logits are random; the draft rows are the target rows plus noise.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/factory.h"
#include "sampling/verify.h"
#ifdef SPECULA_HAVE_VULKAN
#include "backend/vulkan/vulkan_backend.h"
#endif

using namespace specula;

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

template <typename F>
double median_us(int reps, F&& body) {
    body();  // warm-up: pipelines, scratch buffers
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        body();
        t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    return median(t);
}

struct Row {
    int V, gamma, batch;
    double tiled_us = 0, tiled_device_us = 0, multi_us = 0, readback_us = 0;
};

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"specula-bench-verify: tiled verify kernel vs multi-dispatch and host readback"};
    std::string backend_name = "vulkan", json_path;
    std::vector<int> vocabs = {32000, 51866, 151936}, gammas = {1, 4, 8, 16}, batches = {1, 4};
    int reps = 20;
    float temperature = 1.0f;
    app.add_option("--backend", backend_name, "vulkan, cuda or cpu");
    app.add_option("--vocab", vocabs, "vocabulary sizes");
    app.add_option("--gamma", gammas, "draft lengths");
    app.add_option("--batch", batches, "sequences verified together");
    app.add_option("-r,--reps", reps, "repetitions (median reported)");
    app.add_option("--temp", temperature, "sampling temperature (> 0)");
    app.add_option("--json", json_path, "also write the results as JSON");
    CLI11_PARSE(app, argc, argv);

    specula_backend_params bp = specula_backend_default_params();
    if (specula_backend_kind_from_name(backend_name.c_str(), &bp.kind) != SPECULA_OK) {
        std::fprintf(stderr, "unknown backend %s\n", backend_name.c_str());
        return 2;
    }
    std::unique_ptr<Backend> be;
    if (Status s = create_backend(bp, &be); !s.ok()) {
        std::fprintf(stderr, "%s\n", s.message().c_str());
        return 1;
    }
    std::printf("device: %s\n", be->info().name);
    std::printf(
        "| V | gamma | B | tiled us | tiled device us | multi-dispatch us | readback us | "
        "multi/tiled | readback/tiled |\n|---|---|---|---|---|---|---|---|---|\n");
    std::vector<Row> rows;
    std::mt19937 rng(7);
    std::normal_distribution<float> z(0.0f, 3.0f), noise(0.0f, 0.5f);
    for (int V : vocabs)
        for (int gamma : gammas)
            for (int batch : batches) {
                const size_t nt = size_t(batch) * size_t(gamma + 1) * size_t(V);
                const size_t nd = size_t(batch) * size_t(gamma) * size_t(V);
                std::vector<float> target(nt), draft(nd);
                for (float& x : target)
                    x = z(rng);
                for (int b = 0; b < batch; ++b)
                    for (size_t i = 0; i < size_t(gamma) * size_t(V); ++i)
                        draft[size_t(b) * size_t(gamma) * size_t(V) + i] =
                            target[size_t(b) * size_t(gamma + 1) * size_t(V) + i] + noise(rng);
                SamplingParams sp{temperature, 0, 1.0f, 42};
                std::vector<int32_t> drafts;
                for (int b = 0; b < batch; ++b)
                    for (int c = 0; c < gamma; ++c)
                        drafts.push_back(sample_token(
                            std::span(draft).subspan(
                                (size_t(b) * size_t(gamma) + size_t(c)) * size_t(V), size_t(V)),
                            sp, 0, RandomStream::kDraft, uint32_t(c)));

                std::vector<std::unique_ptr<Buffer>> keep;
                auto tensor = [&](GgmlType type, int64_t cols, int64_t rows, const void* data) {
                    Tensor t{nullptr, 0, type, cols, rows};
                    std::unique_ptr<Buffer> buf;
                    if (Status s = be->allocate(t.bytes(), &buf); !s.ok()) {
                        std::fprintf(stderr, "%s\n", s.message().c_str());
                        std::exit(1);
                    }
                    t.buffer = buf.get();
                    keep.push_back(std::move(buf));
                    if (data) be->upload(t, data);
                    return t;
                };
                VerifyArgs a;
                a.target = tensor(GgmlType::kF32, V, int64_t(batch) * (gamma + 1), target.data());
                a.draft = tensor(GgmlType::kF32, V, int64_t(batch) * gamma, draft.data());
                a.drafts = tensor(GgmlType::kI32, int64_t(drafts.size()), 1, drafts.data());
                a.batch = batch;
                a.gamma = gamma;
                a.sampling = sp;
                a.result = tensor(GgmlType::kI32, int64_t(batch) * (gamma + 2), 1, nullptr);
                std::vector<int32_t> out(size_t(a.result.cols));
                // Uploads land before the first measurement.
                if (Status s = be->flush(); !s.ok()) {
                    std::fprintf(stderr, "%s\n", s.message().c_str());
                    return 1;
                }

                Row row{V, gamma, batch};
                std::vector<double> device;
                row.tiled_us = median_us(reps, [&] {
                    be->mark_time(0);
                    be->verify(a);
                    be->mark_time(1);
                    (void)be->download(a.result, out.data());
                    device.push_back(be->seconds_between(0, 1) * 1e6);
                });
                row.tiled_device_us = median(device);
#ifdef SPECULA_HAVE_VULKAN
                if (bp.kind == SPECULA_BACKEND_VULKAN) {
                    std::vector<int32_t> tokens;
                    row.multi_us = median_us(
                        reps, [&] { (void)vulkan_verify_multi_dispatch(*be, a, &tokens); });
                }
#endif
                std::vector<float> host_t(nt), host_d(nd);
                row.readback_us = median_us(reps, [&] {
                    (void)be->download(a.target, host_t.data());
                    (void)be->download(a.draft, host_d.data());
                    for (int b = 0; b < batch; ++b) {
                        const auto g = size_t(gamma), v = size_t(V);
                        (void)verify(
                            std::span(host_t).subspan(size_t(b) * (g + 1) * v, (g + 1) * v),
                            std::span(host_d).subspan(size_t(b) * g * v, g * v),
                            std::span(drafts).subspan(size_t(b) * g, g), V, sp, 0,
                            RandomStream::kResidual, uint32_t(b) * kVerifyRowsPerSequence);
                    }
                });
                auto ratio = [&](double x) { return x > 0 ? x / row.tiled_us : 0.0; };
                std::printf("| %d | %d | %d | %.0f | %.0f | %.0f | %.0f | %.2f | %.2f |\n", V,
                            gamma, batch, row.tiled_us, row.tiled_device_us, row.multi_us,
                            row.readback_us, ratio(row.multi_us), ratio(row.readback_us));
                std::fflush(stdout);
                rows.push_back(row);
            }
    if (!json_path.empty()) {
        nlohmann::json j = nlohmann::json::array();
        for (const Row& r : rows)
            j.push_back({{"vocab", r.V},
                         {"gamma", r.gamma},
                         {"batch", r.batch},
                         {"tiled_us", r.tiled_us},
                         {"tiled_device_us", r.tiled_device_us},
                         {"multi_dispatch_us", r.multi_us},
                         {"readback_us", r.readback_us}});
        std::FILE* f = std::fopen(json_path.c_str(), "w");
        if (f) {
            std::fputs(j.dump(2).c_str(), f);
            std::fclose(f);
        }
    }
    return 0;
}
