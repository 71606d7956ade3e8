#version 450
// out[c][r] = dot(w[r], x[c]) for batches wider than matmul.comp's 16 columns (the Whisper
// encoder's 1500, a prompt). A workgroup of 256 threads computes a tile of 64 rows x 64 columns,
// stepping along the rows a block of 32 weights at a time: the block's weights of the tile's
// rows (dequantized once, a quarter block per thread) and the 32 inputs of its columns go to
// shared memory, and each thread accumulates 4 rows x 4 columns from there (rows tr + 16 i,
// columns tc + 16 j, so neighbouring threads read neighbouring words). A weight is read from
// memory once per 64 columns, where sliced into matmul.comp it is read once per 16.
// Each sum is one fma per weight in row order, not matmul.comp's order: a column computed in a
// batch of more than 16 columns may differ from the same column in a narrower batch by
// rounding (batch invariance is promised up to the verification batch).
//   binding 0: w (rows x cols, weight type), 1: x (n x cols, f32, 16-byte aligned),
//   2: out (n x rows, f32)
//   u0 = cols, u1 = rows, u2 = n, u3 = out row stride (floats), u4 = 1: out += sum,
//   u5 = row tiles (the groups' linear index is row tile + u5 * column tile)
#include "common.glsl"

const uint TILE = kMatmulTile, STEP = kMatmulTileStep, PER = TILE / STEP;  // outputs per thread
// Thread t loads quarter t % 4 of the block of tile row (and column) t / 4, and computes the
// products of tile rows t % STEP + STEP i and columns t / STEP + STEP j (the C++ side asserts
// that the workgroup is 4 x TILE = STEP x STEP threads).
layout(std430, binding = 1) readonly buffer XVectors { vec4 x4[]; };  // binding 1 again

// [k][row or column], padded so that the stores of a quarter block fall in distinct banks.
shared float ws[kBlockWeights][TILE + 1u];
shared float xs[kBlockWeights][TILE + 1u];

void main() {
    const uint t = gl_LocalInvocationID.x;
    const uint cols = pc.u0, rows = pc.u1, n = pc.u2, row_tiles = pc.u5;
    const uint tile = group_index();
    if (tile >= row_tiles * ((n + TILE - 1u) / TILE)) return;  // a folded grid's spare groups
    const uint r0 = (tile % row_tiles) * TILE, c0 = (tile / row_tiles) * TILE;
    const uint tr = t % STEP, tc = t / STEP;
    const uint lr = t / 4u, q = t % 4u;
    const uint blocks = cols / kBlockWeights, row_bytes = row_bytes_of(cols);

    float acc[PER][PER];
    [[unroll]] for (uint i = 0u; i < PER; ++i)
        [[unroll]] for (uint j = 0u; j < PER; ++j) acc[i][j] = 0.0;

    for (uint b = 0u; b < blocks; ++b) {
        float w8[8];
        if (r0 + lr < rows) {
            load_quarter(0u, pc.off0 + (r0 + lr) * row_bytes, b, q, w8);
        } else {
            [[unroll]] for (uint k = 0u; k < 8u; ++k) w8[k] = 0.0;
        }
        vec4 lo = vec4(0.0), hi = vec4(0.0);
        if (c0 + lr < n) {
            const uint xi = pc.off1 / 16u + ((c0 + lr) * cols + b * kBlockWeights + q * 8u) / 4u;
            lo = x4[xi];
            hi = x4[xi + 1u];
        }
        [[unroll]] for (uint k = 0u; k < 8u; ++k) ws[q * 8u + k][lr] = w8[k];
        [[unroll]] for (uint k = 0u; k < 4u; ++k) {
            xs[q * 8u + k][lr] = lo[k];
            xs[q * 8u + 4u + k][lr] = hi[k];
        }
        barrier();
        [[unroll]] for (uint k = 0u; k < kBlockWeights; ++k) {
            float a[PER], x[PER];
            [[unroll]] for (uint i = 0u; i < PER; ++i) a[i] = ws[k][tr + STEP * i];
            [[unroll]] for (uint j = 0u; j < PER; ++j) x[j] = xs[k][tc + STEP * j];
            [[unroll]] for (uint i = 0u; i < PER; ++i)
                [[unroll]] for (uint j = 0u; j < PER; ++j) acc[i][j] = fma(a[i], x[j], acc[i][j]);
        }
        barrier();
    }
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        const uint c = c0 + tc + STEP * j;
        if (c >= n) continue;
        [[unroll]] for (uint i = 0u; i < PER; ++i) {
            const uint r = r0 + tr + STEP * i;
            if (r >= rows) continue;
            const uint at = pc.off2 / 4u + c * pc.u3 + r;
            b2[at] = floatBitsToUint(pc.u4 != 0u ? uintBitsToFloat(b2[at]) + acc[i][j] : acc[i][j]);
        }
    }
}
