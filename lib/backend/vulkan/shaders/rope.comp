#version 450
// In-place rotation of adjacent pairs by a host-computed cos/sin table.
//   binding 0: x (rows x cols), 1: positions (i32), 2: table (n_ctx x n_rot)
//   u0 = cols, u1 = rows, u2 = head_dim, u3 = n_rot
#include "common.glsl"

layout(constant_id = 0) const uint WG = 64u;

void main() {
    const uint pairs_per_row = pc.u0 / pc.u2 * (pc.u3 / 2u);
    const uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pairs_per_row * pc.u1) return;
    const uint row = i / pairs_per_row, k = i % pairs_per_row;
    const uint head = k / (pc.u3 / 2u), j = k % (pc.u3 / 2u);
    const uint pos = b1[pc.off1 / 4u + row];
    const float c = uintBitsToFloat(b2[pc.off2 / 4u + pos * pc.u3 + 2u * j]);
    const float s = uintBitsToFloat(b2[pc.off2 / 4u + pos * pc.u3 + 2u * j + 1u]);
    const uint at = pc.off0 / 4u + row * pc.u0 + head * pc.u2 + 2u * j;
    const float a = uintBitsToFloat(b0[at]), b = uintBitsToFloat(b0[at + 1u]);
    b0[at] = floatBitsToUint(rotated(a, b, c, s, false));
    b0[at + 1u] = floatBitsToUint(rotated(a, b, c, s, true));
}
