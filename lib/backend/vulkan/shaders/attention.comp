#version 450
// Grouped-query attention for one (query row, head) per workgroup: causal (row i sees keys
// 0 .. pos0 + i, or with a sliding window of u6 > 0 the last u6 of them) or over a fixed
// number of keys (u5 > 0). Scores are scale * q.k, capped smoothly at ±f1 where f1 > 0.
// Keys are processed in tiles of WG with an online softmax (running max and
// sum, rescaled per tile) in a fixed order, so the result does not depend on
// how many rows were submitted together.
//   binding 0: q (n x n_head*head_dim), 1: k cache, 2: v cache (rows of n_head_kv*head_dim),
//   3: out (like q)
//   u0 = n_head, u1 = n_head_kv, u2 = head_dim (<= 2 * WG), u3 = pos0, u4 = rows,
//   u5 = keys every row sees (0: causal), u6 = sliding window (0: none); f0 = scale,
//   f1 = soft cap (0: none)
#include "common.glsl"

layout(constant_id = 0) const uint WG = 128u;

layout(std430, binding = 1) readonly buffer KeyVectors { vec4 k4[]; };  // binding 1 again

shared float q_s[2u * WG];
shared float tile[WG];
shared float red[WG];

float reduce(float v, bool take_max) {
    const uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    for (uint stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride) red[tid] = take_max ? max(red[tid], red[tid + stride]) : red[tid] + red[tid + stride];
        barrier();
    }
    const float r = red[0];
    barrier();
    return r;
}

void main() {
    const uint job = group_index();
    const uint n_head = pc.u0, hd = pc.u2;
    if (job >= pc.u4 * n_head) return;
    const uint row = job / n_head, head = job % n_head;
    const uint kv_head = head / (n_head / pc.u1);
    const uint kv_cols = pc.u1 * hd;
    const uint n_keys = pc.u5 > 0u ? pc.u5 : pc.u3 + row + 1u;
    const uint first = pc.u5 == 0u && pc.u6 > 0u && n_keys > pc.u6 ? n_keys - pc.u6 : 0u;
    const uint tid = gl_LocalInvocationID.x;
    const bool k_vectors = (pc.off1 & 15u) == 0u && (hd & 3u) == 0u;
    const uint q_at = pc.off0 / 4u + row * n_head * hd + head * hd;
    for (uint d = tid; d < hd; d += WG) q_s[d] = uintBitsToFloat(b0[q_at + d]);
    barrier();

    float m = -1.0 / 0.0, l = 0.0;
    float acc0 = 0.0, acc1 = 0.0;  // dims tid and tid + WG
    for (uint t0 = first; t0 < n_keys; t0 += WG) {
        const uint t = t0 + tid;
        float s = -1.0 / 0.0;
        if (t < n_keys) {
            const uint k_at = pc.off1 / 4u + t * kv_cols + kv_head * hd;
            float dot_qk = 0.0;
            if (k_vectors) {  // the same products in the same order, in 16-byte loads
                for (uint d = 0u; d < hd / 4u; ++d) {
                    const vec4 kv = k4[k_at / 4u + d];
                    dot_qk = fma(q_s[4u * d], kv.x, dot_qk);
                    dot_qk = fma(q_s[4u * d + 1u], kv.y, dot_qk);
                    dot_qk = fma(q_s[4u * d + 2u], kv.z, dot_qk);
                    dot_qk = fma(q_s[4u * d + 3u], kv.w, dot_qk);
                }
            } else {
                for (uint d = 0u; d < hd; ++d) dot_qk = fma(q_s[d], uintBitsToFloat(b1[k_at + d]), dot_qk);
            }
            s = dot_qk * pc.f0;
            // tanh as e^x ratios overflows for large x; tanh(±10) is already ±1 in floats.
            if (pc.f1 > 0.0) s = tanh(clamp(s * (1.0 / pc.f1), -10.0, 10.0)) * pc.f1;
        }
        const float m_new = max(m, reduce(s, true));
        const float p = t < n_keys ? exp(s - m_new) : 0.0;
        tile[tid] = p;
        const float tile_sum = reduce(p, false);  // its barriers also publish tile[]
        const float correction = exp(m - m_new);
        l = l * correction + tile_sum;
        const uint count = min(WG, n_keys - t0);
        const uint v_at = pc.off2 / 4u + t0 * kv_cols + kv_head * hd;
        if (tid < hd) {
            float a = 0.0;
            for (uint i = 0u; i < count; ++i) a = fma(tile[i], uintBitsToFloat(b2[v_at + i * kv_cols + tid]), a);
            acc0 = acc0 * correction + a;
        }
        if (tid + WG < hd) {
            float a = 0.0;
            for (uint i = 0u; i < count; ++i) a = fma(tile[i], uintBitsToFloat(b2[v_at + i * kv_cols + tid + WG]), a);
            acc1 = acc1 * correction + a;
        }
        m = m_new;
        barrier();  // tile[] is rewritten by the next iteration
    }
    const uint o_at = pc.off3 / 4u + row * n_head * hd + head * hd;
    if (tid < hd) b3[o_at + tid] = floatBitsToUint(acc0 / l);
    if (tid + WG < hd) b3[o_at + tid + WG] = floatBitsToUint(acc1 / l);
}
