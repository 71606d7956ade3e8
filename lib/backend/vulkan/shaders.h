// The SPIR-V of backend/vulkan/shaders/*.comp, compiled by glslc at build time and embedded.
#pragma once

#include <cstddef>
#include <cstdint>

namespace specula {

struct EmbeddedShader {
    const char* name;  // file name without extension, plus the weight type for typed variants
    const uint32_t* code;
    size_t bytes;
};

extern const EmbeddedShader vulkan_shaders[];
extern const size_t vulkan_shader_count;

}  // namespace specula
