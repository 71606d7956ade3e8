// Deterministic float math for sampling and verification (docs/DESIGN.md "Sampling and random
// numbers").
//
// The same logits and seed must give the same tokens on every backend, but
// GPU exp/log/division are not correctly rounded and drivers reorder sums.
// Everything a sampling decision depends on is therefore built here from
// operations that IEEE 754 and Vulkan both require to be correctly rounded
// (add, sub, mul, float<->int conversion, floor, bit casts), evaluated in a
// fixed order with no fused multiply-add: this file is compiled with
// -ffp-contract=off, backend/vulkan/shaders/detmath.glsl marks every value `precise`, and
// backend/cuda/decode.cu is compiled with --fmad=false. The three copies must stay
// identical; their constants come from core/device_abi.h.
//
// Results are accurate to a few ulp, which is all sampling needs; what matters
// is that they are bit-identical everywhere. Values below e^-40 relative to a
// row's maximum are treated as probability 0 (at most V * 4e-18 of mass), which
// also keeps every intermediate a normal float, so flush-to-zero cannot differ.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>

#include "core/device_abi.h"
#include "core/philox.h"

namespace specula::det {

constexpr float kExpCutoff = std::bit_cast<float>(shared::kBitsExpCutoff);  // -40

// Canonical summation: tiles of kTile elements, each summed as kLanes lane
// partials (lane l adds elements l, l + kLanes, ... of the tile in order) and
// a halving tree over the lanes; the tile sums are combined by the same tree.
// A GPU workgroup of kLanes threads computes exactly this.
constexpr uint32_t kLanes = shared::kDetLanes;
constexpr uint32_t kLaneItems = shared::kDetLaneItems;
constexpr uint32_t kTile = shared::kDetTile;
constexpr uint32_t kMaxVocab = shared::kDetMaxVocab;  // tile sums fit one tree

inline float from_bits(uint32_t b) {
    return std::bit_cast<float>(b);
}
inline uint32_t to_bits(float f) {
    return std::bit_cast<uint32_t>(f);
}

// Constants by their bits, so that C++, GLSL and CUDA cannot parse them differently.
constexpr float kLog2E = std::bit_cast<float>(shared::kBitsLog2E);
constexpr float kLn2Hi = std::bit_cast<float>(shared::kBitsLn2Hi);
constexpr float kLn2Lo = std::bit_cast<float>(shared::kBitsLn2Lo);
constexpr float kSqrt2 = std::bit_cast<float>(shared::kBitsSqrt2);
constexpr float kRaceSlack = std::bit_cast<float>(shared::kBitsRaceSlack);
constexpr uint32_t kExpTaylor[6] = {shared::kBitsInv7Fact, shared::kBitsInv6Fact,
                                    shared::kBitsInv5Fact, shared::kBitsInv4Fact,
                                    shared::kBitsInv3Fact, shared::kBitsInv2Fact};
constexpr uint32_t kAtanhSeries[5] = {shared::kBitsInv11, shared::kBitsInv9, shared::kBitsInv7,
                                      shared::kBitsInv5, shared::kBitsInv3};

// e^x for x <= 0 (0 below kExpCutoff and for NaN): Cody-Waite reduction by ln 2 and a
// degree-7 Taylor polynomial; exp(0) is exactly 1.
inline float exp_nonpositive(float x) {
    if (!(x >= kExpCutoff)) return 0.0f;
    const float k = std::floor(x * kLog2E + 0.5f);
    const float r = (x - k * kLn2Hi) - k * kLn2Lo;
    float p = from_bits(kExpTaylor[0]);
    for (int i = 1; i < 6; ++i)
        p = p * r + from_bits(kExpTaylor[i]);
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return p * from_bits(uint32_t(127 + int(k)) << 23);
}

// 1 / z for normal positive z below 2^125: a bit-trick estimate and four Newton steps.
inline float reciprocal(float z) {
    float r = from_bits(shared::kRecipMagic - to_bits(z));
    for (int i = 0; i < 4; ++i)
        r = r * (2.0f - z * r);
    return r;
}

// ln u for normal positive u: u = 2^e * f with f in [0.707, 1.414], then
// ln f = 2 atanh(t), t = (f - 1) / (f + 1), by its odd series to t^11.
inline float log_positive(float u) {
    const uint32_t b = to_bits(u);
    int e = int(b >> 23) - 127;
    float f = from_bits((b & 0x007FFFFFu) | 0x3F800000u);
    if (f > kSqrt2) {
        f = f * 0.5f;
        e = e + 1;
    }
    const float y = f - 1.0f;
    const float t = y * reciprocal(y + 2.0f);
    const float t2 = t * t;
    float s = from_bits(kAtanhSeries[0]);
    for (int i = 1; i < 5; ++i)
        s = s * t2 + from_bits(kAtanhSeries[i]);
    s = s * t2 + 1.0f;
    const float ef = float(e);
    const float low = (t + t) * s + ef * kLn2Lo;
    return ef * kLn2Hi + low;
}

// A monotone map of floats to unsigned integers (-0 ranks just below +0).
inline uint32_t order_key(float s) {
    const uint32_t b = to_bits(s);
    return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

// 1 / E with E = -ln u ~ Exp(1): the weight of a token whose uniform is u in an
// exponential race (argmax a(x) / E_x draws x with probability a(x) / sum a).
inline float race_weight(float u) {
    return reciprocal(-log_positive(u));
}

// Whether a token with weight a and uniform u cannot beat a race's best score so far:
// -ln u >= 1 - u bounds its score a / E by a / (1 - u), with a margin far above the few
// ulp of error in race_weight. Skipping such tokens changes no result, in any order,
// and spares the log and reciprocals of most of a vocabulary.
inline bool race_cannot_win(float a, float best, float u) {
    return a < best * ((1.0f - u) * kRaceSlack);
}

inline float lane_tree(std::array<float, kLanes>& lanes) {
    for (uint32_t stride = kLanes / 2; stride > 0; stride /= 2)
        for (uint32_t l = 0; l < stride; ++l)
            lanes[l] = lanes[l] + lanes[l + stride];
    return lanes[0];
}

// The canonical sum of value(i) for i < n (n <= kMaxVocab).
template <class Value>
float canonical_sum(uint32_t n, const Value& value) {
    std::array<float, kLanes> tiles{}, lanes{};
    for (uint32_t t = 0; t * kTile < n; ++t) {
        for (uint32_t l = 0; l < kLanes; ++l) {
            float acc = 0.0f;
            for (uint32_t k = 0; k < kLaneItems; ++k) {
                const uint32_t i = t * kTile + k * kLanes + l;
                if (i >= n) break;  // i grows with k: the rest of the lane is empty
                acc = acc + value(i);
            }
            lanes[l] = acc;
        }
        tiles[t] = lane_tree(lanes);
    }
    return lane_tree(tiles);
}

// canonical_sum(n, v) for a v that is +0 except at `ids` (ascending, < n) and never negative:
// adding +0 to a partial sum that is not -0 leaves it unchanged, so visiting only `ids` in
// ascending order (each lane's own order) and running the halving trees over the lanes they
// touched (a lane without a partner at its level passes its sum on unchanged) gives the same
// float bit for bit, in time proportional to the number of ids.
template <class Value>
float canonical_sum_sparse(uint32_t n, std::span<const uint32_t> ids, const Value& value) {
    (void)n;
    // Only `used` needs zeros: a slot is written before it is read, touched and the tiles
    // are read below their counts.
    std::array<float, kLanes> slot;
    std::array<uint8_t, kLanes> used{};
    std::array<uint32_t, kLanes> touched;
    uint32_t n_touched = 0;
    auto add = [&](uint32_t lane, float v) {
        if (!used[lane]) {
            used[lane] = 1;
            slot[lane] = 0.0f;
            touched[n_touched++] = lane;
        }
        slot[lane] = slot[lane] + v;
    };
    // The halving tree over the touched lanes: lanes[l] = lanes[l] + lanes[l + stride].
    auto tree = [&]() {
        for (uint32_t stride = kLanes / 2; stride > 0; stride /= 2) {
            uint32_t kept = 0;
            for (uint32_t i = 0; i < n_touched; ++i) {
                const uint32_t l = touched[i];
                if (l < stride) {
                    touched[kept++] = l;
                    continue;
                }
                used[l] = 0;
                const uint32_t to = l - stride;
                if (used[to]) {
                    slot[to] = slot[to] + slot[l];
                } else {
                    used[to] = 1;
                    slot[to] = slot[l];
                    touched[kept++] = to;
                }
            }
            n_touched = kept;
        }
        const float sum = n_touched > 0 ? slot[0] : 0.0f;
        used[0] = 0;
        n_touched = 0;
        return sum;
    };
    std::array<float, kLanes> tile_sums;
    std::array<uint32_t, kLanes> tiles;
    uint32_t n_tiles = 0;
    for (size_t p = 0; p < ids.size();) {
        const uint32_t t = ids[p] / kTile;
        for (; p < ids.size() && ids[p] / kTile == t; ++p)
            add(ids[p] % kLanes, value(ids[p]));
        tile_sums[n_tiles] = tree();
        tiles[n_tiles++] = t;
    }
    for (uint32_t i = 0; i < n_tiles; ++i)
        add(tiles[i], tile_sums[i]);
    return tree();
}

}  // namespace specula::det
