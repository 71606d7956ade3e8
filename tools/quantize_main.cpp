// specula-quantize: a GGUF model's weight matrices in another type or llama.cpp's K-quant mixes.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>

#include "quantizer.h"

int main(int argc, char** argv) {
    std::string in, out;
    specula::QuantizeOptions options;
    CLI::App app{"Write a GGUF model with its weight matrices quantized"};
    app.add_option("input", in, "a GGUF model (F32 or F16 matrices)")->required();
    app.add_option("output", out, "the GGUF file to write")->required();
    app.add_option("scheme", options.scheme, specula::quantize_scheme_names())->required();
    app.add_flag("--allow-requantize", options.allow_requantize,
                 "decode and requantize matrices that are already quantized");
    app.add_option("--output-tensor-type", options.output_type,
                   "the type of output.weight instead of the scheme's (q4_k, q8_0, ...): a "
                   "draft's head read more cheaply");
    CLI11_PARSE(app, argc, argv);
    specula::QuantizeReport report;
    const specula::Status s = specula::quantize_gguf(in, out, options, &report);
    if (!s.ok()) {
        std::fprintf(stderr, "specula-quantize: %s\n", s.message().c_str());
        return 1;
    }
    std::map<std::string, int> counts;
    for (const auto& [name, type] : report.types)
        ++counts[specula::ggml_type_name(type)];
    for (const auto& [type, n] : counts)
        std::printf("%-5s %d tensors\n", type.c_str(), n);
    std::printf("%.2f MB -> %.2f MB\n", double(report.bytes_in) / 1e6,
                double(report.bytes_out) / 1e6);
    return 0;
}
