#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace specula {

// How Q8_0 and Q4_0 weights are multiplied: with inputs quantized to 8 bits per block of 32
// (integer dot products, as llama.cpp's cpu backend; the default), or with the float inputs
// (the GPU backends' arithmetic, which tests compare them with).
enum class CpuInputs { kQuantized, kFloat };
// kFloat where the environment variable SPECULA_CPU_FLOAT_INPUTS is set (and not "0").
CpuInputs cpu_inputs_from_environment();

// n_threads <= 0: every hardware thread. The kernels run on the best instruction set the CPU
// has, or on the one the environment variable SPECULA_CPU_SIMD names (for the whole process,
// decided at the first call; tests and benchmarks take each compiled one in turn).
std::unique_ptr<Backend> create_cpu_backend(int n_threads,
                                            CpuInputs inputs = cpu_inputs_from_environment());

// Whether SPECULA_CPU_SIMD, where set, names an instruction set the kernels run on here:
// INVALID_ARGUMENT for a name no build knows, NO_DEVICE for one this build or CPU lacks.
Status cpu_simd_environment();

}  // namespace specula
