#include "backend/backend.h"

#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"

namespace specula {

size_t Tensor::row_bytes() const {
    const GgmlTypeTraits* t = ggml_type_traits(type);
    return size_t(cols) / t->block_size * t->block_bytes;
}

Tensor Tensor::row_range(int64_t first, int64_t count) const {
    Tensor v = *this;
    v.offset += size_t(first) * row_bytes();
    v.rows = count;
    return v;
}

std::vector<float> rope_table(int n_ctx, int n_rot, float base) {
    std::vector<float> table(size_t(n_ctx) * size_t(n_rot));
    for (int pos = 0; pos < n_ctx; ++pos) {
        for (int j = 0; j < n_rot / 2; ++j) {
            const double theta = double(pos) * std::pow(double(base), -2.0 * j / n_rot);
            table[size_t(pos) * size_t(n_rot) + size_t(2 * j)] = float(std::cos(theta));
            table[size_t(pos) * size_t(n_rot) + size_t(2 * j) + 1] = float(std::sin(theta));
        }
    }
    return table;
}

std::vector<specula_device_info> enumerate_devices() {
    std::vector<specula_device_info> devices;
    specula_device_info cpu{};
    cpu.kind = SPECULA_BACKEND_CPU;
    cpu.index = 0;
    std::snprintf(cpu.name, sizeof cpu.name, "cpu");
    devices.push_back(cpu);
    return devices;
}

Status create_backend(const specula_backend_params& params, std::unique_ptr<Backend>* out) {
    switch (params.kind) {
        case SPECULA_BACKEND_CPU:
        case SPECULA_BACKEND_AUTO:  // no GPU backend is compiled in yet
            *out = create_cpu_backend(params.n_threads);
            return Status::Ok();
        case SPECULA_BACKEND_VULKAN:
            return {SPECULA_ERR_NO_DEVICE, "this build of specula has no Vulkan backend"};
        case SPECULA_BACKEND_CUDA:
            return {SPECULA_ERR_NO_DEVICE, "this build of specula has no CUDA backend"};
    }
    return InvalidArgument("unknown backend kind " + std::to_string(int(params.kind)));
}

}  // namespace specula
