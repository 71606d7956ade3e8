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
