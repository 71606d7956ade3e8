// What the host code, the CUDA kernels and the GLSL shaders must agree on,
// written once: random stream ids, the canonical-sum geometry and the bits of the
// deterministic math's constants, the verify scratch layout and the weight block
// layouts. C++ and CUDA include this file; glslc includes it into every shader
// (backend/vulkan/shaders/common.glsl, -I lib/core). It is written in the subset of C++ and GLSL
// that both read: `uint` values with a `u` suffix, and functions over `uint`.
#ifndef SPECULA_DEVICE_ABI_H
#define SPECULA_DEVICE_ABI_H

#if defined(__cplusplus)
#include <cstdint>
#if defined(__CUDACC__)
#define SPECULA_ABI_FN __host__ __device__ inline constexpr
#else
#define SPECULA_ABI_FN inline constexpr
#endif
#define SPECULA_ABI_UINT(name, value) inline constexpr uint name = value;
#define SPECULA_ABI_FLOAT(name, value) inline constexpr float name = value;
namespace specula::shared {
using uint = uint32_t;
#else
#define SPECULA_ABI_FN
#define SPECULA_ABI_UINT(name, value) const uint name = value;
#define SPECULA_ABI_FLOAT(name, value) const float name = value;
#endif

// GELU's erf(x) to 1.5e-7 (Abramowitz and Stegun 7.1.26; GLSL has no erf, and the cpu's
// vector form is this too): t = 1 / (1 + p |x|), erf(x) = sign(x) (1 - t (a1 + t (a2 + t (a3 +
// t (a4 + t a5)))) e^(-x^2)).
SPECULA_ABI_FLOAT(kErfP, 0.3275911f)
SPECULA_ABI_FLOAT(kErfA1, 0.254829592f)
SPECULA_ABI_FLOAT(kErfA2, -0.284496736f)
SPECULA_ABI_FLOAT(kErfA3, 1.421413741f)
SPECULA_ABI_FLOAT(kErfA4, -1.453152027f)
SPECULA_ABI_FLOAT(kErfA5, 1.061405429f)

// Activations (Backend::Activation), alone or gating a product (out = act(g) * u): silu(g) =
// g / (1 + e^-g) (Llama's SwiGLU), the tanh form of GELU (Gemma's GeGLU), g / 2 (1 + tanh(z))
// with z = s (g + c g^3), computed as g / (1 + e^(-2z)): the same function, without tanh's
// overflow in GLSL; and GELU's exact form g / 2 (1 + erf(g / sqrt 2)) (Whisper, and GeGLUs
// trained with it), erf as kErf* approximate it where a language has none.
SPECULA_ABI_UINT(kActivationSilu, 0u)
SPECULA_ABI_UINT(kActivationGeluTanh, 1u)
SPECULA_ABI_UINT(kActivationGeluErf, 2u)
SPECULA_ABI_FLOAT(kGeluTanhScale, 0.7978845608f)  // sqrt(2 / pi)
SPECULA_ABI_FLOAT(kGeluTanhCubic, 0.044715f)

// Philox streams: every use of noise salts its counter with its own id, so draft
// sampling, the acceptance test and the residual draw never share noise.
SPECULA_ABI_UINT(kStreamSample, 1u)  // standalone sampling
SPECULA_ABI_UINT(kStreamDraft, 2u)   // draft tokens inside a step of Leviathan et al.'s test
SPECULA_ABI_UINT(kStreamAccept, 3u)  // the uniforms of the acceptance test
// The residual / bonus-token draw; plain decoding (a step with γ = 0) and the coupled
// acceptance (draft and target alike) draw on it at a position's own row (position_row).
SPECULA_ABI_UINT(kStreamResidual, 4u)

// Philox4x32-10's multipliers and key increments.
SPECULA_ABI_UINT(kPhiloxMul0, 0xD2511F53u)
SPECULA_ABI_UINT(kPhiloxMul1, 0xCD9E8D57u)
SPECULA_ABI_UINT(kPhiloxWeyl0, 0x9E3779B9u)
SPECULA_ABI_UINT(kPhiloxWeyl1, 0xBB67AE85u)
SPECULA_ABI_UINT(kBitsTwoToMinus23, 0x34000000u)  // a uniform's scale: 23 random bits

// Canonical sums: tiles of kDetLanes * kDetLaneItems elements, each summed as kDetLanes lane
// partials and a halving tree over the lanes (a GPU workgroup of kDetLanes threads).
SPECULA_ABI_UINT(kDetLanes, 256u)
SPECULA_ABI_UINT(kDetLaneItems, 16u)
SPECULA_ABI_UINT(kDetTile, (kDetLanes * kDetLaneItems))
SPECULA_ABI_UINT(kDetMaxVocab, (kDetTile * kDetLanes))  // the tile sums of a row fit one tree

// The deterministic math's constants by their bits, so no compiler parses them differently.
SPECULA_ABI_UINT(kBitsExpCutoff, 0xC2200000u)  // -40: e^x is 0 below
SPECULA_ABI_UINT(kBitsLog2E, 0x3FB8AA3Bu)      // 1.44269504
SPECULA_ABI_UINT(kBitsLn2Hi, 0x3F317200u)      // 0.693145752, 16 bits
SPECULA_ABI_UINT(kBitsLn2Lo, 0x35BFBE8Eu)      // 1.42860677e-6
SPECULA_ABI_UINT(kBitsSqrt2, 0x3FB504F3u)      // 1.41421354
SPECULA_ABI_UINT(kBitsInv7Fact, 0x39500D01u)   // e^r's Taylor coefficients 1/7! .. 1/2!
SPECULA_ABI_UINT(kBitsInv6Fact, 0x3AB60B61u)
SPECULA_ABI_UINT(kBitsInv5Fact, 0x3C088889u)
SPECULA_ABI_UINT(kBitsInv4Fact, 0x3D2AAAABu)
SPECULA_ABI_UINT(kBitsInv3Fact, 0x3E2AAAABu)
SPECULA_ABI_UINT(kBitsInv2Fact, 0x3F000000u)
SPECULA_ABI_UINT(kBitsInv11, 0x3DBA2E8Cu)  // log's atanh series 1/11 .. 1/3
SPECULA_ABI_UINT(kBitsInv9, 0x3DE38E39u)
SPECULA_ABI_UINT(kBitsInv7, 0x3E124925u)
SPECULA_ABI_UINT(kBitsInv5, 0x3E4CCCCDu)
SPECULA_ABI_UINT(kBitsInv3, 0x3EAAAAABu)
SPECULA_ABI_UINT(kRecipMagic, 0x7EF311C3u)     // the reciprocal's first guess: magic - bits(z)
SPECULA_ABI_UINT(kBitsRaceSlack, 0x3F7FBE77u)  // 0.999: a race draw that cannot win is skipped

// Verification of a batch: sequence b draws its noise at rows b * kVerifyRowsPerSequence + c.
SPECULA_ABI_UINT(kVerifyRowsPerSequence, 256u)

// The verify passes (backend/vulkan/shaders/decode.comp's MODE, recorded in this order by the host:
// tile max, row max, tile sum (unfiltered rows), row norm, accept, race, finish; greedy: tile max,
// accept) and the flags the host passes them.
SPECULA_ABI_UINT(kVerifyPassTileMax, 0u)
SPECULA_ABI_UINT(kVerifyPassTileSum, 1u)
SPECULA_ABI_UINT(kVerifyPassRowNorm, 2u)
SPECULA_ABI_UINT(kVerifyPassAccept, 3u)
SPECULA_ABI_UINT(kVerifyPassRace, 4u)
SPECULA_ABI_UINT(kVerifyPassFinish, 5u)
SPECULA_ABI_UINT(kVerifyPassRowMax, 6u)
SPECULA_ABI_UINT(kVerifyFlagGreedy, 1u)
SPECULA_ABI_UINT(kVerifyFlagWriteResult, 2u)
SPECULA_ABI_UINT(kVerifyFlagWriteToken, 4u)
SPECULA_ABI_UINT(kVerifyFlagFiltered, 8u)  // top-k or top-p cuts the row

// The verify passes' scratch, in 32-bit words, for `rows` logits rows (target and draft rows
// of every sequence) of `tiles` tiles each and `batch` sequences:
//   tile maxima, tile arg-maxima, tile sums (rows x tiles each), four words of row norm per
//   row, one accepted count per sequence, four words of race state per sequence and tile.
SPECULA_ABI_FN uint verify_rows_per_sequence(uint gamma, bool greedy) {
    return greedy ? gamma + 1u : 2u * gamma + 1u;
}
SPECULA_ABI_FN uint verify_tiles(uint n_vocab) {
    return (n_vocab + kDetTile - 1u) / kDetTile;
}
SPECULA_ABI_FN uint verify_tile_max_word(uint tiles, uint r, uint j) {
    return r * tiles + j;
}
SPECULA_ABI_FN uint verify_tile_arg_word(uint rows, uint tiles, uint r, uint j) {
    return (rows + r) * tiles + j;
}
SPECULA_ABI_FN uint verify_tile_sum_word(uint rows, uint tiles, uint r, uint j) {
    return (2u * rows + r) * tiles + j;
}
SPECULA_ABI_FN uint verify_norm_word(uint rows, uint tiles, uint r) {
    return 3u * rows * tiles + 4u * r;
}
SPECULA_ABI_FN uint verify_accepted_word(uint rows, uint tiles, uint b) {
    return 3u * rows * tiles + 4u * rows + b;
}
SPECULA_ABI_FN uint verify_race_word(uint rows, uint tiles, uint batch, uint b, uint j) {
    return 3u * rows * tiles + 4u * rows + batch + 4u * (b * tiles + j);
}
SPECULA_ABI_FN uint verify_scratch_words(uint rows, uint tiles, uint batch) {
    return verify_race_word(rows, tiles, batch, batch, 0u);
}

// Weight blocks as GGUF stores them: every type is read in blocks of kBlockWeights weights
// (F32 and F16 too); Q8_0 and Q4_0 blocks begin with an fp16 scale (kBlockScaleBytes). The
// K-quants store super-blocks of kSuperBlockWeights weights (8 blocks of 32 with their own
// scales); their bytes per block of 32 are not whole (Q6_K: 26.25), so a row's blocks are
// found through its super-blocks.
SPECULA_ABI_UINT(kBlockWeights, 32u)
SPECULA_ABI_UINT(kBlockScaleBytes, 2u)
SPECULA_ABI_UINT(kF32BlockBytes, 128u)
SPECULA_ABI_UINT(kF16BlockBytes, 64u)
SPECULA_ABI_UINT(kQ8_0BlockBytes, 34u)
SPECULA_ABI_UINT(kQ4_0BlockBytes, 18u)
SPECULA_ABI_UINT(kQ4_1BlockBytes, 20u)
SPECULA_ABI_UINT(kQ5_0BlockBytes, 22u)
SPECULA_ABI_UINT(kQ5_1BlockBytes, 24u)
SPECULA_ABI_UINT(kSuperBlockWeights, 256u)
SPECULA_ABI_UINT(kKScaleBytes, 12u)  // Q4_K / Q5_K: 8 scales and 8 mins of 6 bits
SPECULA_ABI_UINT(kQ4_KBlockBytes, 144u)
SPECULA_ABI_UINT(kQ5_KBlockBytes, 176u)
SPECULA_ABI_UINT(kQ6_KBlockBytes, 210u)

// The many-column matmul (backend/vulkan/shaders/matmul_tiled.comp): tiles of kMatmulTile rows x
// kMatmulTile columns, kMatmulTileThreads threads each computing (kMatmulTile / kMatmulTileStep)^2
// outputs.
SPECULA_ABI_UINT(kMatmulTile, 64u)
SPECULA_ABI_UINT(kMatmulTileStep, 16u)
SPECULA_ABI_UINT(kMatmulTileThreads, 256u)

// Logit mask programs (sampling/mask_program.h) as the words a device reads
// (backend/vulkan/shaders/mask_logits.comp; program_words): the program's header, the state of
// the tokens sampled before a step, then each mask's words.
SPECULA_ABI_UINT(kMaskWordMarkedBegin, 0u)    // tokens from this id on are marked
SPECULA_ABI_UINT(kMaskWordOutweighBegin, 1u)  // the outweigh rule's first id, or -1: none
SPECULA_ABI_UINT(kMaskWordCount, 2u)          // masks in the program
SPECULA_ABI_UINT(kMaskWordStateCount, 3u)     // MaskState
SPECULA_ABI_UINT(kMaskWordStateLast, 4u)
SPECULA_ABI_UINT(kMaskWordStatePenultimate, 5u)
SPECULA_ABI_UINT(kMaskWordStateLastMarked, 6u)
SPECULA_ABI_UINT(kMaskWordFirstMask, 7u)
// A mask's words, from its first: the conditions that must all hold and those that must not,
// then its range [from, to) as (base, offset) pairs.
SPECULA_ABI_UINT(kMaskWordsPerMask, 6u)
SPECULA_ABI_UINT(kMaskMaxMasks, 24u)
SPECULA_ABI_UINT(kMaskProgramWords, 151u)  // kMaskWordFirstMask + kMaskMaxMasks * kMaskWordsPerMask
// Conditions on the tokens a row sees (bits).
SPECULA_ABI_UINT(kMaskIfInitial, 1u)     // none sampled yet
SPECULA_ABI_UINT(kMaskIfLastMarked, 2u)  // the last one is marked
SPECULA_ABI_UINT(kMaskIfPairClosed, 4u)  // fewer than two, or the penultimate one is marked
SPECULA_ABI_UINT(kMaskIfAnyMarked, 8u)   // one of them is marked
// A bound is base + offset, the base one of these.
SPECULA_ABI_UINT(kMaskBaseZero, 0u)
SPECULA_ABI_UINT(kMaskBaseVocab, 1u)       // the vocabulary's size
SPECULA_ABI_UINT(kMaskBaseLastMarked, 2u)  // the latest marked token seen

#if defined(__cplusplus)
}  // namespace specula::shared
#endif
#undef SPECULA_ABI_UINT
#endif
