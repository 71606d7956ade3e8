#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/options.h"
#include "core/thread_pool.h"

namespace specula {

// n_threads <= 0: every hardware thread. The kernels run on the best instruction set the CPU
// has, or on the one the environment variable SPECULA_CPU_SIMD names (for the whole process,
// decided at the first call; tests and benchmarks take each compiled one in turn). Options read:
// int8_inputs (quantized weights times inputs quantized to 8 bits per block of 32, integer dot
// products as llama.cpp's cpu backend, by default; off: times the float inputs, the GPU
// backends' arithmetic, which tests compare them with) and profile.
std::unique_ptr<Backend> create_cpu_backend(
    int n_threads,
    const specula_backend_options& options = resolve_options(SPECULA_BACKEND_CPU, {}));

// Whether SPECULA_CPU_SIMD, where set, names an instruction set the kernels run on here:
// INVALID_ARGUMENT for a name no build knows, NO_DEVICE for one this build or CPU lacks.
Status cpu_simd_environment();

}  // namespace specula
