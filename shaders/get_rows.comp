#version 450
// out[i] = table[ids[i]] as f32.
//   binding 0: table (weight type), 1: ids (i32), 2: out (f32)
//   u0 = cols, u1 = number of ids, u2 = table rows
#include "common.glsl"

layout(constant_id = 0) const uint WG = 64u;

void main() {
    const uint i = group_index();
    if (i >= pc.u1) return;
    const uint cols = pc.u0;
    const uint id = min(b1[pc.off1 / 4u + i], pc.u2 - 1u);  // ids are validated on the host; never read out of bounds
    const uint row_bytes = row_bytes_of(cols);
    for (uint g = gl_LocalInvocationID.x; g < cols / 8u; g += WG) {  // g: quarter g % 4 of block g / 4
        float w[8];
        load_quarter(0u, pc.off0 + id * row_bytes, g / 4u, g % 4u, w);
        [[unroll]] for (uint j = 0u; j < 8u; ++j) b2[pc.off2 / 4u + i * cols + g * 8u + j] = floatBitsToUint(w[j]);
    }
}
