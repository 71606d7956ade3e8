// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
// Counter-based: the value at (key, counter) needs no state, so the CPU, Vulkan
// and CUDA backends draw identical streams. The GLSL and CUDA copies of this
// function must stay bit-identical to this one.
#pragma once

#include <array>
#include <bit>
#include <cstdint>

#include "core/device_abi.h"

namespace specula {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

inline PhiloxCounter philox4x32_10(PhiloxCounter c, PhiloxKey k) {
    constexpr uint32_t kMul0 = shared::kPhiloxMul0, kMul1 = shared::kPhiloxMul1;
    constexpr uint32_t kWeyl0 = shared::kPhiloxWeyl0, kWeyl1 = shared::kPhiloxWeyl1;
    for (int round = 0; round < 10; ++round) {
        const uint64_t p0 = uint64_t(kMul0) * c[0];
        const uint64_t p1 = uint64_t(kMul1) * c[2];
        c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1],
             uint32_t(p0)};
        k[0] += kWeyl0;
        k[1] += kWeyl1;
    }
    return c;
}

// Independent random streams. Draft sampling and residual resampling must never
// share noise, so every use salts the counter with its own stream id (device_abi.h).
enum class RandomStream : uint32_t {
    kSample = shared::kStreamSample,  // sample_token's default; plain decoding is a step with γ = 0
    kDraft = shared::kStreamDraft,
    kAccept = shared::kStreamAccept,
    kResidual = shared::kStreamResidual,
};

// One uniform in the open interval (0, 1): 23 random bits centred in their
// cell, so never 0 (log u is finite) and never 1 (-log u > 0, so an exponential
// race cannot be won by a zero-length draw). Exactly representable in fp32, so
// every backend computes the same float from the same word.
inline float uniform_from_bits(uint32_t bits) {
    return (float(bits >> 9) + 0.5f) * std::bit_cast<float>(shared::kBitsTwoToMinus23);
}

// The uniform for (seed, stream, step, row, element). Each backend evaluates exactly this.
inline float philox_uniform(uint64_t seed, RandomStream stream, uint32_t step, uint32_t row,
                            uint32_t element) {
    const PhiloxKey key = {uint32_t(seed), uint32_t(seed >> 32)};
    const PhiloxCounter ctr = {element, row, step, uint32_t(stream)};
    return uniform_from_bits(philox4x32_10(ctr, key)[0]);
}

}  // namespace specula
