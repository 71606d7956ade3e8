#include "backend/options.h"

#include <cstdlib>
#include <cstring>

namespace specula {
namespace {

// The environment's name of a path for each backend kind (nullptr: that kind has none): 1 forces
// it on, 0 off.
struct PathVariable {
    specula_path specula_backend_options::*field;
    const char* cpu;
    const char* vulkan;
    const char* cuda;
};
constexpr PathVariable kPaths[] = {
    {&specula_backend_options::int8_inputs, nullptr, nullptr, "SPECULA_CUDA_INT8_INPUTS"},
    {&specula_backend_options::tiled, nullptr, "SPECULA_VULKAN_TILED", "SPECULA_CUDA_TILED"},
    {&specula_backend_options::fused_norm, nullptr, "SPECULA_VULKAN_FUSED_NORM", nullptr},
    {&specula_backend_options::fused_rope, nullptr, "SPECULA_VULKAN_FUSED_ROPE",
     "SPECULA_CUDA_FUSED_ROPE"},
    {&specula_backend_options::fused_gate, nullptr, nullptr, "SPECULA_CUDA_FUSED_GATE"},
    {&specula_backend_options::subgroups, nullptr, "SPECULA_VULKAN_SUBGROUPS", nullptr},
    {&specula_backend_options::pin_subgroup, nullptr, "SPECULA_VULKAN_PIN_SUBGROUP", nullptr},
    {&specula_backend_options::small_storage, nullptr, "SPECULA_VULKAN_SMALL_STORAGE", nullptr},
    {&specula_backend_options::staged, nullptr, nullptr, "SPECULA_CUDA_STAGED"},
    {&specula_backend_options::tensor_cores, nullptr, nullptr, "SPECULA_CUDA_TENSOR_CORES"},
    {&specula_backend_options::split_attention, nullptr, nullptr, "SPECULA_CUDA_SPLIT_ATTENTION"},
    {&specula_backend_options::host_rules, nullptr, nullptr, "SPECULA_CUDA_HOST_RULES"},
    {&specula_backend_options::amx, "SPECULA_CPU_AMX", nullptr, nullptr},
};

const char* variable(const PathVariable& v, specula_backend_kind kind) {
    switch (kind) {
        case SPECULA_BACKEND_CPU:
            return v.cpu;
        case SPECULA_BACKEND_VULKAN:
            return v.vulkan;
        case SPECULA_BACKEND_CUDA:
            return v.cuda;
        default:
            return nullptr;
    }
}

const char* value_of(const char* name) {
    const char* v = name != nullptr ? std::getenv(name) : nullptr;
    return v != nullptr && *v != '\0' ? v : nullptr;
}

}  // namespace

specula_backend_options resolve_options(specula_backend_kind kind,
                                        const specula_backend_options& set) {
    specula_backend_options o = set;
    for (const PathVariable& p : kPaths) {
        const char* v = value_of(variable(p, kind));
        if (v == nullptr || o.*p.field != SPECULA_PATH_AUTO) continue;
        if (std::strcmp(v, "1") == 0) o.*p.field = SPECULA_PATH_ON;
        if (std::strcmp(v, "0") == 0) o.*p.field = SPECULA_PATH_OFF;
    }
    // SPECULA_CPU_FLOAT_INPUTS: any value but 0 multiplies by the float inputs.
    if (const char* v = value_of("SPECULA_CPU_FLOAT_INPUTS");
        v && kind == SPECULA_BACKEND_CPU && o.int8_inputs == SPECULA_PATH_AUTO)
        o.int8_inputs = std::strcmp(v, "0") == 0 ? SPECULA_PATH_ON : SPECULA_PATH_OFF;
    if (kind == SPECULA_BACKEND_VULKAN) {
        if (const char* v = value_of("SPECULA_VULKAN_BARRIERS"); v && std::strcmp(v, "all") == 0)
            o.barrier_every_dispatch = true;
        if (const char* v = value_of("SPECULA_VULKAN_MAX_RANGE"); v && o.max_binding_bytes == 0)
            o.max_binding_bytes = std::strtoull(v, nullptr, 10);
    }
    const char* profile = kind == SPECULA_BACKEND_CPU      ? "SPECULA_CPU_PROFILE"
                          : kind == SPECULA_BACKEND_VULKAN ? "SPECULA_VULKAN_PROFILE"
                                                           : nullptr;
    if (const char* v = value_of(profile); v && std::strcmp(v, "1") == 0) o.profile = true;
    return o;
}

const char* cpu_simd_requested() {
    return value_of("SPECULA_CPU_SIMD");
}

bool vulkan_validation_requested() {
    const char* v = value_of("SPECULA_VULKAN_VALIDATION");
    return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace specula
