#version 450
// The multi-dispatch verification that tools/bench_verify.cpp compares the tiled
// kernel with: what a framework-level implementation does (softmax of both models
// into full probability rows, the ratios, a host readback of the acceptances, the
// residual row, its normalisation, an inverse-CDF sample). Benchmark only; not exact
// across backends (native exp and division).
//   u0 V, u1 batch, u2 gamma, u3 rows, f0 1 / temperature; MODE (constant 1):
//   0 softmax: rows of binding 0 -> binding 1 (one workgroup per row)
//   1 ratio: P (0), Q (1), drafts (2) -> accepted flags (3), grid batch
//   2 residual: P (0), Q (1), n per sequence (2) -> residual rows (3), grid batch
//   3 normalise: residual rows (3) in place, grid batch
//   4 sample: residual rows (3) -> token (4), grid batch
#include "common.glsl"

layout(constant_id = 0) const uint WG = 256u;
layout(constant_id = 1) const uint MODE = 0u;

shared float sh[256];

float reduce(float v, bool is_max) {
    const uint l = gl_LocalInvocationID.x;
    sh[l] = v;
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        barrier();
        if (l < s) sh[l] = is_max ? max(sh[l], sh[l + s]) : sh[l] + sh[l + s];
    }
    barrier();
    const float r = sh[0];
    barrier();
    return r;
}

float uniform01(uint a, uint b) {  // a cheap hash: this baseline need not match anything
    uint h = a * 0x9E3779B9u ^ (b + 0x7F4A7C15u);
    h ^= h >> 16; h *= 0x85EBCA6Bu; h ^= h >> 13; h *= 0xC2B2AE35u; h ^= h >> 16;
    return (float(h >> 8) + 0.5) / 16777216.0;
}

void main() {
    const uint g = group_index(), l = gl_LocalInvocationID.x, V = pc.u0, gamma = pc.u2;
    if (MODE == 0u) {
        const uint in0 = pc.off0 / 4u + g * V, out0 = pc.off1 / 4u + g * V;
        float m = -1.0 / 0.0;
        for (uint x = l; x < V; x += WG) m = max(m, uintBitsToFloat(b0[in0 + x]) * pc.f0);
        m = reduce(m, true);
        float s = 0.0;
        for (uint x = l; x < V; x += WG) s += exp(uintBitsToFloat(b0[in0 + x]) * pc.f0 - m);
        s = reduce(s, false);
        for (uint x = l; x < V; x += WG)
            b1[out0 + x] = floatBitsToUint(exp(uintBitsToFloat(b0[in0 + x]) * pc.f0 - m) / s);
    } else if (MODE == 1u) {
        if (l >= gamma) return;
        const uint x = b2[pc.off2 / 4u + g * gamma + l];
        const float p = uintBitsToFloat(b0[pc.off0 / 4u + (g * (gamma + 1u) + l) * V + x]);
        const float q = uintBitsToFloat(b1[pc.off1 / 4u + (g * gamma + l) * V + x]);
        b3[pc.off3 / 4u + g * gamma + l] = uniform01(g, l) < p / q ? 1u : 0u;
    } else if (MODE == 2u) {
        const uint n = b2[pc.off2 / 4u + g];
        const uint p0 = pc.off0 / 4u + (g * (gamma + 1u) + n) * V;
        const uint q0 = pc.off1 / 4u + (g * gamma + n) * V;
        for (uint x = l; x < V; x += WG) {
            const float p = uintBitsToFloat(b0[p0 + x]);
            const float q = n < gamma ? uintBitsToFloat(b1[q0 + x]) : 0.0;
            b3[pc.off3 / 4u + g * V + x] = floatBitsToUint(max(0.0, p - q));
        }
    } else if (MODE == 3u) {
        const uint r0 = pc.off3 / 4u + g * V;
        float s = 0.0;
        for (uint x = l; x < V; x += WG) s += uintBitsToFloat(b3[r0 + x]);
        s = reduce(s, false);
        for (uint x = l; x < V; x += WG) b3[r0 + x] = floatBitsToUint(uintBitsToFloat(b3[r0 + x]) / s);
    } else {
        // Inverse CDF: each invocation sums a contiguous chunk, a scan over the chunk sums
        // finds the chunk holding u, and that chunk is walked.
        const uint r0 = pc.off3 / 4u + g * V, chunk = (V + WG - 1u) / WG;
        float s = 0.0;
        for (uint x = l * chunk; x < min(V, (l + 1u) * chunk); ++x) s += uintBitsToFloat(b3[r0 + x]);
        sh[l] = s;
        barrier();
        if (l == 0u) {
            const float u = uniform01(g, 99u);
            float acc = 0.0;
            uint c = 0u;
            while (c + 1u < WG && acc + sh[c] <= u) acc += sh[c++];
            uint token = min(c * chunk, V - 1u);
            for (uint x = c * chunk; x < min(V, (c + 1u) * chunk); ++x) {
                token = x;
                acc += uintBitsToFloat(b3[r0 + x]);
                if (acc > u) break;
            }
            b4[pc.off4 / 4u + g] = token;
        }
    }
}
