// A backend's options (specula_backend_options, lib/include/specula.h): what the app set, with
// the environment's test and benchmark hooks filling what it left to the backend. The
// environment is read here, and no backend reads it.
#pragma once

#include "specula.h"

namespace specula {

// `set` for a backend of `kind`, each field left AUTO (false, 0) taken from the environment
// variable that names it for that kind, where one is set (docs/PROGRAMS.md, "Backend options").
specula_backend_options resolve_options(specula_backend_kind kind,
                                        const specula_backend_options& set);

// Whether a path is taken: forced on, or left AUTO where the backend takes it by default.
constexpr bool path_on(specula_path path, bool by_default) {
    return path == SPECULA_PATH_ON || (path == SPECULA_PATH_AUTO && by_default);
}

// The process-wide test hooks, which choose for every backend of the process at once:
// SPECULA_CPU_SIMD, the instruction set of the cpu kernels (nullptr: the best this CPU runs), and
// SPECULA_VULKAN_VALIDATION=1, the Khronos validation layer on the Vulkan instance.
const char* cpu_simd_requested();
bool vulkan_validation_requested();

}  // namespace specula
