#version 450
// Rows over a subset of the columns as whole rows (Backend::expand_columns): element (r, c) of
// out is src[r][j] where ids[j] = c, else fill; each thread finds its j by binary search.
//   binding 0: src (rows of u2), 1: ids (i32, u2 of them, ascending), 2: out (rows of u1)
//   u0 = out elements, u1 = out cols, u2 = src cols; f0 = fill
#include "common.glsl"

layout(constant_id = 0) const uint WG = 64u;

void main() {
    const uint i = group_index() * WG + gl_LocalInvocationID.x;
    if (i >= pc.u0) return;
    const uint r = i / pc.u1, c = i % pc.u1;
    uint lo = 0u, hi = pc.u2;  // the first j with ids[j] >= c lies in [lo, hi]
    while (lo < hi) {
        const uint mid = (lo + hi) / 2u;
        if (b1[pc.off1 / 4u + mid] < c) lo = mid + 1u;
        else hi = mid;
    }
    const bool kept = lo < pc.u2 && b1[pc.off1 / 4u + lo] == c;
    b2[pc.off2 / 4u + i] = kept ? b0[pc.off0 / 4u + r * pc.u2 + lo] : floatBitsToUint(pc.f0);
}
