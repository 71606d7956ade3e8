// The Vulkan backend: compute shaders from shaders/, one command buffer per
// forward pass, one host wait per flush.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace specula {

// Vulkan devices with a compute queue, best first (discrete, integrated,
// virtual, then software). Empty when no loader or driver is installed.
std::vector<specula_device_info> enumerate_vulkan_devices();
Status create_vulkan_backend(const specula_backend_params& params, std::unique_ptr<Backend>* out);

// The multi-dispatch verification baseline of tools/bench_verify.cpp (see
// backend/vulkan/shaders/verify_baseline.comp): sampled verification with two host waits.
Status vulkan_verify_multi_dispatch(Backend& vulkan, const VerifyArgs& args,
                                    std::vector<int32_t>* tokens);

// Whether this Vulkan backend reads weights through 8/16-bit storage (see
// SPECULA_VULKAN_SMALL_STORAGE in docs/PROGRAMS.md); false for any other backend.
bool vulkan_reads_small_storage(const Backend& vulkan);
// The subgroup size this Vulkan backend's matmul sums over (0: shared memory instead), and
// whether its pipelines require that size (SPECULA_VULKAN_PIN_SUBGROUP in docs/PROGRAMS.md); 0 for
// any other backend.
uint32_t vulkan_matmul_subgroup(const Backend& vulkan, bool* pinned = nullptr);

// Messages of severity "error" that the Khronos validation layer reported in
// this process. The layer is enabled when SPECULA_VULKAN_VALIDATION=1.
uint64_t vulkan_validation_error_count();
bool vulkan_validation_enabled();

}  // namespace specula
