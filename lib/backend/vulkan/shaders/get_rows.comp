#version 450
// out[i] = table[ids[i]] as f32, for the ids of the table's rows [u3, u3 + u4) that are bound (a
// weight held in parts is read part by part; every id lies in one of them).
//   binding 0: table rows u3.. (weight type), 1: ids (i32), 2: out (f32)
//   u0 = cols, u1 = number of ids, u2 = table rows, u3 = first bound row, u4 = bound rows
#include "common.glsl"

layout(constant_id = 0) const uint WG = 64u;

void main() {
    const uint i = group_index();
    if (i >= pc.u1) return;
    const uint cols = pc.u0;
    const uint id = min(b1[pc.off1 / 4u + i], pc.u2 - 1u);  // ids are validated on the host; never read out of bounds
    if (id < pc.u3 || id - pc.u3 >= pc.u4) return;
    const uint row_bytes = row_bytes_of(cols);
    for (uint g = gl_LocalInvocationID.x; g < cols / 8u; g += WG) {  // g: quarter g % 4 of block g / 4
        float w[8];
        load_quarter(0u, pc.off0 + (id - pc.u3) * row_bytes, g / 4u, g % 4u, w);
        [[unroll]] for (uint j = 0u; j < 8u; ++j) b2[pc.off2 / 4u + i * cols + g * 8u + j] = floatBitsToUint(w[j]);
    }
}
