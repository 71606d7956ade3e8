// Sums and maxima over a warp or a whole block, for the kernels of ops.cu and decode.cu.
// A block's blockDim.x is a multiple of the warp size; `shared` holds one float per warp.
// block_sum's order is fixed (lanes by a butterfly, then the warps' sums by one), so a row's
// sum depends only on the block size; a maximum is exact in any order.
#pragma once

#include <cmath>

namespace specula::cuda {

constexpr int kWarp = 32;

__device__ inline float warp_sum(float v) {
    for (int o = kWarp / 2; o > 0; o /= 2)
        v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

namespace detail {
template <int K, int O>
__device__ inline void sum_scatter_stage(float* v, int lane) {
    if constexpr (O > 0) {
        if constexpr (K > 1) {
            constexpr int h = K / 2;
            const bool upper = (lane & O) != 0;
#pragma unroll
            for (int i = 0; i < h; ++i) {
                const float send = upper ? v[i] : v[i + h], keep = upper ? v[i + h] : v[i];
                v[i] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, O);
            }
            sum_scatter_stage<h, O / 2>(v, lane);
        } else {
            v[0] += __shfl_xor_sync(0xFFFFFFFFu, v[0], O);
            sum_scatter_stage<1, O / 2>(v, lane);
        }
    }
}
}  // namespace detail

constexpr int log2_of(int k) {
    return k <= 1 ? 0 : 1 + log2_of(k / 2);
}

// K values per lane (K a power of two), each summed over the warp's lanes bit for bit as warp_sum
// sums it (the same pairs added at the same stages, xor 16, 8, 4, 2, 1; an addition's two
// operands may come in the other order, which IEEE addition does not see), in K - 1 + 5 -
// log2 K shuffles instead of 5 K: at each stage a lane sends half of its values to its partner
// and keeps the sums of the other half. Afterwards lane l holds the sums of values
// (l >> kScatterShift<K>) * kScatterHeld<K> + i in v[i], i < kScatterHeld<K> (lanes that differ
// only in their low kScatterShift<K> bits hold the same ones).
template <int K>
constexpr int kScatterHeld = K >= kWarp ? K / kWarp : 1;
template <int K>
constexpr int kScatterShift = K >= kWarp ? 0 : log2_of(kWarp) - log2_of(K);
template <int K>
__device__ inline void warp_sum_scatter(float* v) {
    static_assert(K > 0 && (K & (K - 1)) == 0, "a power of two of values");
    detail::sum_scatter_stage<K, kWarp / 2>(v, threadIdx.x % kWarp);
}

__device__ inline float block_sum(float v, float* shared) {
    v = warp_sum(v);
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    const int warps = blockDim.x / kWarp;
    v = lane < warps ? shared[lane] : 0.0f;
    v = warp_sum(v);
    __syncthreads();
    return v;
}

__device__ inline float block_max(float v, float* shared) {
    for (int o = kWarp / 2; o > 0; o /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    const int warps = blockDim.x / kWarp;
    v = lane < warps ? shared[lane] : -INFINITY;
    for (int o = kWarp / 2; o > 0; o /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    __syncthreads();
    return v;
}

}  // namespace specula::cuda
