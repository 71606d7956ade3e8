// The CUDA backend: the same op set and verify passes as the Vulkan backend
// (kernels in ops.cu and decode.cu), on one CUDA stream per backend; a forward
// or a whole speculative step runs without host synchronisation until a
// download reads its result.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"

namespace specula {

// CUDA devices; empty when no driver or device is present.
std::vector<specula_device_info> enumerate_cuda_devices();
Status create_cuda_backend(const specula_backend_params& params, std::unique_ptr<Backend>* out);

}  // namespace specula
