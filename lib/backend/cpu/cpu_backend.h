#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace specula {

// n_threads <= 0: every hardware thread. The kernels run on the best instruction set the CPU
// has, or on the one the environment variable SPECULA_CPU_SIMD names (for the whole process,
// decided at the first call; tests and benchmarks take each compiled one in turn).
std::unique_ptr<Backend> create_cpu_backend(int n_threads);

// Whether SPECULA_CPU_SIMD, where set, names an instruction set the kernels run on here:
// INVALID_ARGUMENT for a name no build knows, NO_DEVICE for one this build or CPU lacks.
Status cpu_simd_environment();

}  // namespace specula
