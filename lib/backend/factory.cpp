#include "backend/factory.h"

#include <algorithm>
#include <string>
#include <system_error>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "backend/options.h"
#include "core/log.h"
#ifdef SPECULA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#ifdef SPECULA_HAVE_VULKAN
#include "backend/vulkan/vulkan_backend.h"
#endif

namespace specula {

std::vector<specula_device_info> enumerate_devices() {
    std::vector<specula_device_info> devices;
    specula_device_info cpu{};
    cpu.kind = SPECULA_BACKEND_CPU;
    cpu.index = 0;
    std::snprintf(cpu.name, sizeof cpu.name, "cpu");
    devices.push_back(cpu);
#ifdef SPECULA_HAVE_CUDA
    for (const auto& d : enumerate_cuda_devices())
        devices.push_back(d);
#endif
#ifdef SPECULA_HAVE_VULKAN
    for (const auto& d : enumerate_vulkan_devices())
        devices.push_back(d);
#endif
    return devices;
}

Status create_backend(const specula_backend_params& params, std::unique_ptr<Backend>* out) {
    switch (params.kind) {
        case SPECULA_BACKEND_CPU:
            if (Status s = cpu_simd_environment(); !s.ok()) return s;
            try {
                // More threads than the machine has would only take turns on its cores.
                const int hardware = int(std::max(1u, std::thread::hardware_concurrency()));
                *out = create_cpu_backend(std::min<int>(params.n_threads, hardware),
                                          resolve_options(SPECULA_BACKEND_CPU, params.options));
            } catch (const std::system_error& e) {  // a worker thread could not be started
                return OutOfMemory(std::string("cannot start the cpu backend's threads: ") +
                                   e.what());
            }
            return Status::Ok();
        case SPECULA_BACKEND_AUTO: {
            // CUDA on NVIDIA, then a Vulkan GPU (software devices are skipped, below), then
            // the cpu backend.
#ifdef SPECULA_HAVE_CUDA
            specula_backend_params cu = params;
            cu.kind = SPECULA_BACKEND_CUDA;
            if (create_cuda_backend(cu, out).ok()) return Status::Ok();
#endif
#ifdef SPECULA_HAVE_VULKAN
            // A software device (llvmpipe) is a CPU running GPU-shaped code: the cpu
            // backend is faster, so only a real GPU is taken.
            const auto vulkan = enumerate_vulkan_devices();
            for (size_t i = 0; i < vulkan.size(); ++i) {
                if (vulkan[i].is_software) continue;
                specula_backend_params vk = params;
                vk.kind = SPECULA_BACKEND_VULKAN;
                vk.device_index = int32_t(i);
                vk.device_name = nullptr;
                const Status s = create_vulkan_backend(vk, out);
                if (s.ok()) return s;
                log(SPECULA_LOG_INFO, "auto backend: Vulkan device " + std::string(vulkan[i].name) +
                                          " unavailable (" + s.message() + ")");
            }
#endif
            *out = create_cpu_backend(params.n_threads,
                                      resolve_options(SPECULA_BACKEND_CPU, params.options));
            return Status::Ok();
        }
        case SPECULA_BACKEND_VULKAN:
#ifdef SPECULA_HAVE_VULKAN
            return create_vulkan_backend(params, out);
#else
            return {SPECULA_ERR_NO_DEVICE, "this build of specula has no Vulkan backend"};
#endif
        case SPECULA_BACKEND_CUDA:
#ifdef SPECULA_HAVE_CUDA
            return create_cuda_backend(params, out);
#else
            return {SPECULA_ERR_NO_DEVICE, "this build of specula has no CUDA backend"};
#endif
    }
    return InvalidArgument("unknown backend kind " + std::to_string(int(params.kind)));
}

}  // namespace specula
