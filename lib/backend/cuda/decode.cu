// The verify passes of backend/vulkan/shaders/decode.comp in CUDA, bit for bit: the arithmetic
// of lib/core/detmath.h (this file is compiled with --fmad=false, so nothing is
// fused), the same canonical sums, the same Philox streams. The constants and the
// scratch layout are lib/core/device_abi.h's; read decode.comp for the passes. The searches of
// a filtered row's kept set are decode.comp's too (their shared-memory sizes are each file's).
#include <cfloat>

#include "block_reduce.cuh"
#include "core/device_abi.h"
#include "kernels.h"

namespace specula::cuda {

namespace {

using namespace shared;  // the constants and the scratch layout
constexpr uint32_t kLanes = kDetLanes, kLaneItems = kDetLaneItems, kTile = kDetTile;
constexpr uint32_t kNone = 0xFFFFFFFFu;

__device__ float bits(uint32_t b) {
    return __uint_as_float(b);
}

__device__ float det_exp(float x) {
    if (!(x >= bits(kBitsExpCutoff))) return 0.0f;
    const float k = floorf(x * bits(kBitsLog2E) + 0.5f);
    const float r = (x - k * bits(kBitsLn2Hi)) - k * bits(kBitsLn2Lo);
    float p = bits(kBitsInv7Fact);
    p = p * r + bits(kBitsInv6Fact);
    p = p * r + bits(kBitsInv5Fact);
    p = p * r + bits(kBitsInv4Fact);
    p = p * r + bits(kBitsInv3Fact);
    p = p * r + bits(kBitsInv2Fact);
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return p * bits(uint32_t(127 + int(k)) << 23);
}

__device__ float det_recip(float z) {
    float r = bits(kRecipMagic - __float_as_uint(z));
    for (int i = 0; i < 4; ++i)
        r = r * (2.0f - z * r);
    return r;
}

__device__ float det_log(float u) {
    const uint32_t b = __float_as_uint(u);
    int e = int(b >> 23) - 127;
    float f = bits((b & 0x007FFFFFu) | 0x3F800000u);
    if (f > bits(kBitsSqrt2)) {
        f = f * 0.5f;
        e = e + 1;
    }
    const float y = f - 1.0f;
    const float t = y * det_recip(y + 2.0f);
    const float t2 = t * t;
    float s = bits(kBitsInv11);
    s = s * t2 + bits(kBitsInv9);
    s = s * t2 + bits(kBitsInv7);
    s = s * t2 + bits(kBitsInv5);
    s = s * t2 + bits(kBitsInv3);
    s = s * t2 + 1.0f;
    const float ef = float(e);
    const float low = (t + t) * s + ef * bits(kBitsLn2Lo);
    return ef * bits(kBitsLn2Hi) + low;
}

__device__ bool race_cannot_win(float a, float best, float u) {
    return a < best * ((1.0f - u) * bits(kBitsRaceSlack));
}

__device__ uint32_t order_key(float s) {
    const uint32_t b = __float_as_uint(s);
    return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

__device__ float philox_uniform(uint64_t seed, uint32_t stream, uint32_t step, uint32_t row,
                                uint32_t element) {
    uint32_t c0 = element, c1 = row, c2 = step, c3 = stream;
    uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
    for (int round = 0; round < 10; ++round) {
        const uint32_t hi0 = __umulhi(kPhiloxMul0, c0), lo0 = kPhiloxMul0 * c0;
        const uint32_t hi1 = __umulhi(kPhiloxMul1, c2), lo1 = kPhiloxMul1 * c2;
        const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        k0 += kPhiloxWeyl0;
        k1 += kPhiloxWeyl1;
    }
    return (float(c0 >> 9) + 0.5f) * bits(kBitsTwoToMinus23);
}

struct Ctx {
    DecodeLaunch d;
    uint32_t rows_per_seq, tiles;

    __device__ uint32_t R() const { return d.batch * rows_per_seq; }
    __device__ uint32_t* tile_max(uint32_t r, uint32_t j) const {
        return d.scratch + verify_tile_max_word(tiles, r, j);
    }
    __device__ uint32_t* tile_arg(uint32_t r, uint32_t j) const {
        return d.scratch + verify_tile_arg_word(R(), tiles, r, j);
    }
    __device__ uint32_t* tile_sum(uint32_t r, uint32_t j) const {
        return d.scratch + verify_tile_sum_word(R(), tiles, r, j);
    }
    __device__ uint32_t* norm(uint32_t r) const {
        return d.scratch + verify_norm_word(R(), tiles, r);
    }
    __device__ uint32_t* accepted(uint32_t b) const {
        return d.scratch + verify_accepted_word(R(), tiles, b);
    }
    __device__ uint32_t* race(uint32_t b, uint32_t j) const {
        return d.scratch + verify_race_word(R(), tiles, d.batch, b, j);
    }
    __device__ uint32_t target_row(uint32_t b, uint32_t c) const { return b * rows_per_seq + c; }
    __device__ uint32_t draft_row(uint32_t b, uint32_t c) const {
        return b * rows_per_seq + d.gamma + 1 + c;
    }
    __device__ float scaled(uint32_t r, uint32_t x) const {
        const uint32_t b = r / rows_per_seq, c = r % rows_per_seq;
        const float z = c <= d.gamma ? d.target[(size_t(b) * (d.gamma + 1) + c) * d.V + x]
                                     : d.draft[(size_t(b) * d.gamma + c - d.gamma - 1) * d.V + x];
        return z * d.inv_t;
    }
    __device__ uint32_t noise_row(uint32_t b, uint32_t c) const {
        return d.row_offset + b * kVerifyRowsPerSequence + c;
    }
};

__device__ bool in_cut(uint32_t key, uint32_t x, uint32_t cut_key, uint32_t cut_id) {
    return key > cut_key || (key == cut_key && x <= cut_id);
}

__device__ float prob(const Ctx& c, uint32_t r, uint32_t x) {
    const uint32_t* n = c.norm(r);
    const float s = c.scaled(r, x);
    if (!in_cut(order_key(s), x, n[1], n[2])) return 0.0f;
    return det_exp(s - bits(n[0])) * bits(n[3]);
}

__device__ bool better(float v, uint32_t id, float best_v, uint32_t best_id) {
    return v > best_v || (v == best_v && id < best_id);
}

__device__ float lane_tree(float v, float* sh) {
    const uint32_t l = threadIdx.x;
    sh[l] = v;
    for (uint32_t stride = kLanes / 2; stride > 0; stride >>= 1) {
        __syncthreads();
        if (l < stride) sh[l] = sh[l] + sh[l + stride];
    }
    __syncthreads();
    const float r = sh[0];
    __syncthreads();
    return r;
}

struct Best {
    float v;
    uint32_t id;
};

// Argmax of two sets of (value, id) pairs over the block; the winners in out[0..1].
__device__ void reduce_best(Best a, Best b, Best* sh_a, Best* sh_b) {
    const uint32_t l = threadIdx.x;
    sh_a[l] = a;
    sh_b[l] = b;
    for (uint32_t stride = kLanes / 2; stride > 0; stride >>= 1) {
        __syncthreads();
        if (l < stride) {
            if (better(sh_a[l + stride].v, sh_a[l + stride].id, sh_a[l].v, sh_a[l].id))
                sh_a[l] = sh_a[l + stride];
            if (better(sh_b[l + stride].v, sh_b[l + stride].id, sh_b[l].v, sh_b[l].id))
                sh_b[l] = sh_b[l + stride];
        }
    }
    __syncthreads();
}

// The row maximum m, written by the row-max pass into the row's norm.
__device__ float row_max(const Ctx& c, uint32_t r) {
    return bits(c.norm(r)[0]);
}

__global__ void row_max_kernel(Ctx c) {
    __shared__ float sh[kLanes];
    const uint32_t r = blockIdx.x, l = threadIdx.x;
    sh[l] = l < c.tiles ? bits(*c.tile_max(r, l)) : -INFINITY;
    for (uint32_t stride = kLanes / 2; stride > 0; stride >>= 1) {
        __syncthreads();
        if (l < stride) sh[l] = fmaxf(sh[l], sh[l + stride]);  // any order: max is exact
    }
    if (l == 0) c.norm(r)[0] = __float_as_uint(sh[0]);
}

__global__ void tile_max_kernel(Ctx c) {
    __shared__ Best sh_a[kLanes], sh_b[kLanes];
    const uint32_t r = blockIdx.x / c.tiles, j = blockIdx.x % c.tiles, l = threadIdx.x;
    Best best{-INFINITY, kNone};
    for (uint32_t k = 0; k < kLaneItems; ++k) {
        const uint32_t x = j * kTile + k * kLanes + l;
        if (x >= c.d.V) break;
        const float s = c.scaled(r, x);
        if (better(s, x, best.v, best.id)) best = {s, x};
    }
    reduce_best(best, Best{0.0f, kNone}, sh_a, sh_b);
    if (l == 0) {
        *c.tile_max(r, j) = __float_as_uint(sh_a[0].v);
        *c.tile_arg(r, j) = sh_a[0].id;
    }
}

__global__ void tile_sum_kernel(Ctx c) {
    __shared__ float sh[kLanes];
    const uint32_t r = blockIdx.x / c.tiles, j = blockIdx.x % c.tiles, l = threadIdx.x;
    const float m = row_max(c, r);
    float acc = 0.0f;
    for (uint32_t k = 0; k < kLaneItems; ++k) {
        const uint32_t x = j * kTile + k * kLanes + l;
        if (x >= c.d.V) break;
        acc = acc + det_exp(c.scaled(r, x) - m);
    }
    const float t = lane_tree(acc, sh);
    if (l == 0) *c.tile_sum(r, j) = __float_as_uint(t);
}

__device__ float mass_in(const Ctx& c, uint32_t r, float m, uint32_t cut_key, uint32_t cut_id,
                         uint32_t k_key, uint32_t k_id, float* sh, float* sh_tiles) {
    const uint32_t l = threadIdx.x;
    for (uint32_t j = 0; j < c.tiles; ++j) {
        float acc = 0.0f;
        for (uint32_t k = 0; k < kLaneItems; ++k) {
            const uint32_t x = j * kTile + k * kLanes + l;
            if (x >= c.d.V) break;
            const float s = c.scaled(r, x);
            const uint32_t key = order_key(s);
            if (in_cut(key, x, cut_key, cut_id) && in_cut(key, x, k_key, k_id))
                acc = acc + det_exp(s - m);
        }
        const float t = lane_tree(acc, sh);
        if (l == 0) sh_tiles[j] = t;
    }
    __syncthreads();
    return lane_tree(l < c.tiles ? sh_tiles[l] : 0.0f, sh);
}

// The shortest prefix of the rank order satisfying a monotone predicate (decode.comp).
template <typename Pred>
__device__ void shortest_prefix(const Ctx& c, Pred pred, uint32_t* out_key, uint32_t* out_id) {
    uint32_t lo = 0, hi = kNone;
    if (pred(hi, kNone)) lo = hi;
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (pred(mid, kNone))
            lo = mid;
        else
            hi = mid;
    }
    *out_key = lo;
    uint32_t jlo = 0, jhi = c.d.V - 1;
    if (pred(lo, 0)) jhi = 0;
    while (jhi - jlo > 1) {
        const uint32_t mid = jlo + (jhi - jlo) / 2;
        if (pred(lo, mid))
            jhi = mid;
        else
            jlo = mid;
    }
    *out_id = jhi;
}

// Ranked selection and the kept set's search. The rank order is key descending, id ascending;
// the kept set of a filtered row is a prefix of it. shortest_prefix finds a prefix by bisecting
// the key space (32 steps) and then the ids (log2 V steps), a pass over the row per step; the
// functions below find the same prefix in fewer passes: the L-th token of the order by radix
// selection (counts of each key byte, then id byte: exact in any order of adding), and a top-p
// prefix by gathering the L first tokens, sorting them, and bisecting their ranks. Every mass
// compared is mass_in's canonical sum of the same set, so the cut is the one shortest_prefix
// finds (the set of a rank prefix determines its mass; mass grows with the prefix).
constexpr uint32_t kRadix = 256, kGather = 1024;
static_assert(kLanes >= kRadix, "a histogram bin per lane");

// Adds one to hist[digit] for each lane of the warp (kNone: none); the whole warp calls it.
__device__ void count_digit(uint32_t* hist, uint32_t digit) {
    const uint32_t peers = __match_any_sync(0xFFFFFFFFu, digit);
    if (digit != kNone && int(threadIdx.x % 32) == __ffs(int(peers)) - 1)
        atomicAdd(&hist[digit], uint32_t(__popc(int(peers))));
}

// The bin holding the need-th counted token, bins taken from the highest down (descending) or
// from the lowest up, and that token's place among its bin's: warp 0 scans 8 bins a lane.
__device__ void find_bin(const uint32_t* hist, bool descending, uint32_t need, uint32_t* sh_bin,
                         uint32_t* sh_need) {
    const uint32_t l = threadIdx.x;
    if (l >= 32) return;
    const auto bin = [&](uint32_t p) { return descending ? kRadix - 1 - p : p; };
    uint32_t sum = 0;
    for (uint32_t j = 0; j < 8; ++j)
        sum += hist[bin(8 * l + j)];
    uint32_t upto = sum;  // inclusive prefix over the lanes
    for (uint32_t o = 1; o < 32; o <<= 1) {
        const uint32_t t = __shfl_up_sync(0xFFFFFFFFu, upto, o);
        if (l >= o) upto += t;
    }
    uint32_t before = upto - sum;
    if (before < need && need <= upto) {
        for (uint32_t j = 0; j < 8; ++j) {
            const uint32_t b = bin(8 * l + j);
            if (before + hist[b] >= need) {
                *sh_bin = b;
                *sh_need = need - before;
                break;
            }
            before += hist[b];
        }
    }
}

// The key and id of the L-th token of the rank order of row r (1 <= L <= V).
__device__ void select_ranked(const Ctx& c, uint32_t r, uint32_t L, uint32_t* hist,
                              uint32_t* out_key, uint32_t* out_id) {
    __shared__ uint32_t sh_bin, sh_need;
    const uint32_t l = threadIdx.x;
    uint32_t need = L;
    // One radix pass: counts the digit at shift of the tokens that digit_of does not exclude.
    const auto pass = [&](bool descending, auto digit_of) {
        if (l < kRadix) hist[l] = 0;
        __syncthreads();
        for (uint32_t base = 0; base < c.d.V; base += kLanes)
            count_digit(hist, base + l < c.d.V ? digit_of(base + l) : kNone);
        __syncthreads();
        find_bin(hist, descending, need, &sh_bin, &sh_need);
        __syncthreads();
        const uint32_t b = sh_bin;
        need = sh_need;
        __syncthreads();
        return b;
    };
    uint32_t key = 0, key_mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        key |= pass(true,
                    [&](uint32_t x) {
                        const uint32_t k = order_key(c.scaled(r, x));
                        return (k & key_mask) == key ? (k >> shift) & (kRadix - 1) : kNone;
                    })
               << shift;
        key_mask |= (kRadix - 1) << shift;
    }
    uint32_t id = 0, id_mask = 0;
    const int top = c.d.V > 1 ? 31 - __clz(int(c.d.V - 1)) : 0;  // the largest id's top bit
    for (int shift = top / 8 * 8; shift >= 0; shift -= 8) {
        id |= pass(false,
                   [&](uint32_t x) {
                       return order_key(c.scaled(r, x)) == key && (x & id_mask) == id
                                  ? (x >> shift) & (kRadix - 1)
                                  : kNone;
                   })
              << shift;
        id_mask |= (kRadix - 1) << shift;
    }
    *out_key = key;
    *out_id = id;
}

// The L (<= kGather) tokens of the prefix cut (cut_key, cut_id), in rank order.
__device__ void gather_ranked(const Ctx& c, uint32_t r, uint32_t L, uint32_t cut_key,
                              uint32_t cut_id, uint32_t* keys, uint32_t* ids) {
    __shared__ uint32_t n;
    const uint32_t l = threadIdx.x;
    if (l == 0) n = 0;
    __syncthreads();
    for (uint32_t x = l; x < c.d.V; x += kLanes) {
        const uint32_t key = order_key(c.scaled(r, x));
        if (in_cut(key, x, cut_key, cut_id)) {
            const uint32_t i = atomicAdd(&n, 1u);
            if (i < kGather) {  // L of them: the cut is the L-th token's
                keys[i] = key;
                ids[i] = x;
            }
        }
    }
    uint32_t P = 1;
    while (P < L)
        P <<= 1;
    for (uint32_t i = L + l; i < P; i += kLanes) {  // after every token
        keys[i] = 0;
        ids[i] = kNone;
    }
    __syncthreads();
    const auto before = [&](uint32_t a, uint32_t b) {
        return keys[a] > keys[b] || (keys[a] == keys[b] && ids[a] < ids[b]);
    };
    for (uint32_t k = 2; k <= P; k <<= 1) {  // bitonic sort into rank order
        for (uint32_t j = k >> 1; j > 0; j >>= 1) {
            for (uint32_t i = l; i < P; i += kLanes) {
                const uint32_t partner = i ^ j;
                if (partner > i && ((i & k) == 0 ? before(partner, i) : before(i, partner))) {
                    const uint32_t tk = keys[i], ti = ids[i];
                    keys[i] = keys[partner];
                    ids[i] = ids[partner];
                    keys[partner] = tk;
                    ids[partner] = ti;
                }
            }
            __syncthreads();
        }
    }
}

__global__ void row_norm_kernel(Ctx c) {
    __shared__ float sh[kLanes], sh_tiles[kLanes];
    __shared__ uint32_t sh_u[kLanes];
    __shared__ uint32_t ranked_keys[kGather], ranked_ids[kGather];
    const uint32_t r = blockIdx.x, l = threadIdx.x;
    const float m = row_max(c, r);
    uint32_t cut_key = 0, cut_id = kNone;
    float sum;
    if (!c.d.filtered) {
        sum = lane_tree(l < c.tiles ? bits(*c.tile_sum(r, l)) : 0.0f, sh);
    } else {
        uint32_t k_key = 0, k_id = kNone;
        const bool top_k = c.d.top_k > 0 && c.d.top_k < c.d.V;
        if (top_k) select_ranked(c, r, c.d.top_k, sh_u, &k_key, &k_id);
        cut_key = k_key;
        cut_id = k_id;
        if (c.d.top_p < 1.0f) {
            const float target = c.d.top_p * mass_in(c, r, m, 0, kNone, k_key, k_id, sh, sh_tiles);
            const auto reaches = [&](uint32_t key, uint32_t id) {
                return mass_in(c, r, m, key, id, k_key, k_id, sh, sh_tiles) >= target;
            };
            // The nucleus among the first 64 tokens, else the first kGather, of the top-k set
            // (the whole set reaches the target: its mass is the target's); mass(prefix lo) <
            // target throughout (the empty prefix's 0 to begin with).
            const uint32_t length = top_k ? c.d.top_k : c.d.V;
            bool found = false;
            uint32_t lo = 0;
            for (uint32_t L : {64u, kGather}) {
                L = min(L, length);
                if (found || !(target > 0.0f) || L <= lo) break;
                uint32_t L_key = k_key, L_id = k_id;
                if (L < length) {
                    select_ranked(c, r, L, sh_u, &L_key, &L_id);
                    if (!reaches(L_key, L_id)) {
                        lo = L;
                        continue;
                    }
                }
                gather_ranked(c, r, L, L_key, L_id, ranked_keys, ranked_ids);
                uint32_t hi = L;
                while (hi - lo > 1) {
                    const uint32_t mid = lo + (hi - lo) / 2;
                    (reaches(ranked_keys[mid - 1], ranked_ids[mid - 1]) ? hi : lo) = mid;
                }
                cut_key = ranked_keys[hi - 1];
                cut_id = ranked_ids[hi - 1];
                found = true;
            }
            if (!found) shortest_prefix(c, reaches, &cut_key, &cut_id);
        }
        sum = mass_in(c, r, m, cut_key, cut_id, cut_key, cut_id, sh, sh_tiles);
    }
    if (l == 0) {
        uint32_t* n = c.norm(r);
        n[0] = __float_as_uint(m);
        n[1] = cut_key;
        n[2] = cut_id;
        n[3] = __float_as_uint(det_recip(sum));
    }
}

__device__ void write_outputs(const Ctx& c, uint32_t b, uint32_t n, uint32_t token) {
    if (c.d.result) {
        int32_t* out = c.d.result + size_t(b) * (c.d.gamma + 2);
        out[0] = int32_t(n);
        for (uint32_t i = 0; i < n; ++i)
            out[1 + i] = c.d.drafts[b * c.d.gamma + i];
        out[1 + n] = int32_t(token);
    }
    if (c.d.token) c.d.token[b] = int32_t(token);
}

__device__ uint32_t row_argmax(const Ctx& c, uint32_t r) {
    Best best{-INFINITY, kNone};
    for (uint32_t j = 0; j < c.tiles; ++j) {
        const float v = bits(*c.tile_max(r, j));
        const uint32_t id = *c.tile_arg(r, j);
        if (better(v, id, best.v, best.id)) best = {v, id};
    }
    return best.id == kNone ? 0 : best.id;
}

__global__ void accept_kernel(Ctx c) {
    const uint32_t b = blockIdx.x;
    uint32_t n = 0;
    if (c.d.greedy) {
        while (n < c.d.gamma &&
               row_argmax(c, c.target_row(b, n)) == uint32_t(c.d.drafts[b * c.d.gamma + n]))
            ++n;
        *c.accepted(b) = n;
        write_outputs(c, b, n, row_argmax(c, c.target_row(b, n)));
        return;
    }
    for (; n < c.d.gamma; ++n) {
        const uint32_t x = uint32_t(c.d.drafts[b * c.d.gamma + n]);
        const float p = prob(c, c.target_row(b, n), x), q = prob(c, c.draft_row(b, n), x);
        const float u = philox_uniform(c.d.seed, kStreamAccept, c.d.step, c.noise_row(b, n), 0);
        if (!(u * q < p)) break;
    }
    *c.accepted(b) = n;
}

__global__ void race_kernel(Ctx c) {
    __shared__ Best sh_a[kLanes], sh_b[kLanes];
    const uint32_t b = blockIdx.x / c.tiles, j = blockIdx.x % c.tiles, l = threadIdx.x;
    const uint32_t n = *c.accepted(b), pr = c.target_row(b, n);
    const bool has_q = n < c.d.gamma;
    Best best_a{0.0f, kNone}, best_p{0.0f, kNone};
    for (uint32_t k = 0; k < kLaneItems; ++k) {
        const uint32_t x = j * kTile + k * kLanes + l;
        if (x >= c.d.V) break;
        const float p = prob(c, pr, x);
        if (!(p > 0.0f)) continue;
        const float q = has_q ? prob(c, c.draft_row(b, n), x) : 0.0f;
        const float u = philox_uniform(c.d.seed, c.d.stream, c.d.step, c.noise_row(b, n), x);
        const float ax = fmaxf(0.0f, p - q);
        if (best_p.id != kNone && race_cannot_win(p, best_p.v, u) &&
            (best_a.id == kNone ? !(ax > 0.0f) : race_cannot_win(ax, best_a.v, u)))
            continue;
        const float w = det_recip(-det_log(u));
        const float a = ax * w, s = p * w;
        if (a > 0.0f && better(a, x, best_a.v, best_a.id)) best_a = {a, x};
        if (better(s, x, best_p.v, best_p.id)) best_p = {s, x};
    }
    reduce_best(best_a, best_p, sh_a, sh_b);
    if (l == 0) {
        uint32_t* out = c.race(b, j);
        out[0] = __float_as_uint(sh_a[0].v);
        out[1] = sh_a[0].id;
        out[2] = __float_as_uint(sh_b[0].v);
        out[3] = sh_b[0].id;
    }
}

__global__ void finish_kernel(Ctx c) {
    const uint32_t b = blockIdx.x;
    Best a{0.0f, kNone}, p{0.0f, kNone};
    for (uint32_t j = 0; j < c.tiles; ++j) {
        const uint32_t* t = c.race(b, j);
        if (better(bits(t[0]), t[1], a.v, a.id)) a = {bits(t[0]), t[1]};
        if (better(bits(t[2]), t[3], p.v, p.id)) p = {bits(t[2]), t[3]};
    }
    write_outputs(c, b, *c.accepted(b), a.id != kNone ? a.id : (p.id != kNone ? p.id : 0));
}

// A mask program (backend/vulkan/shaders/mask_logits.comp, read it for the steps): a block per
// row; row r sees the state before the step, then drafts[0, first_row + r).
struct MaskedRow {
    const MaskLaunch& t;
    const float* row;
    int count, last, penultimate, last_marked;
    int outweigh_begin = -1;
    bool outweighed = false;
    // The ranges of the masks whose conditions hold for this row's state (settle()).
    int n_ranges = 0;
    int range_from[kMaskMaxMasks], range_to[kMaskMaxMasks];

    __device__ int word(uint32_t i) const { return t.words[i]; }
    __device__ bool is_marked(int id) const { return id >= word(kMaskWordMarkedBegin); }
    __device__ void after(int token) {
        ++count;
        penultimate = last;
        last = token;
        if (is_marked(token)) last_marked = token;
    }
    __device__ int bound(uint32_t at) const {
        const auto base = uint32_t(word(at));
        const int value = base == kMaskBaseVocab        ? int(t.V)
                          : base == kMaskBaseLastMarked ? last_marked
                                                        : 0;
        return value + word(at + 1);
    }
    __device__ void settle() {
        uint32_t holds = 0;
        if (count == 0) holds |= kMaskIfInitial;
        if (count >= 1 && is_marked(last)) holds |= kMaskIfLastMarked;
        if (count < 2 || is_marked(penultimate)) holds |= kMaskIfPairClosed;
        if (last_marked >= 0) holds |= kMaskIfAnyMarked;
        const int masks = min(word(kMaskWordCount), int(kMaskMaxMasks));
        for (int m = 0; m < masks; ++m) {
            const uint32_t at = kMaskWordFirstMask + uint32_t(m) * kMaskWordsPerMask;
            const auto all = uint32_t(word(at)), none = uint32_t(word(at + 1));
            if ((holds & all) != all || (holds & none) != 0) continue;
            range_from[n_ranges] = bound(at + 2);
            range_to[n_ranges] = bound(at + 4);
            ++n_ranges;
        }
        outweigh_begin = word(kMaskWordOutweighBegin);
    }
    // Whether a mask of the program covers token x.
    __device__ bool ruled_out(int x) const {
        for (int m = 0; m < n_ranges; ++m)
            if (x >= range_from[m] && x < range_to[m]) return true;
        return false;
    }
    __device__ float ruled(int x) const { return ruled_out(x) ? -INFINITY : row[x]; }
    __device__ float masked(int x) const {
        return outweighed && x < outweigh_begin ? -INFINITY : ruled(x);
    }
    // det::canonical_sum over i < n of det_exp(value(from + i) - m), value = ruled or masked.
    __device__ float sum_exp(int from, int n, float m, bool final_row, float* sh,
                             float* sh_tiles) const {
        const uint32_t l = threadIdx.x, tiles = (uint32_t(n) + kTile - 1) / kTile;
        for (uint32_t j = 0; j < tiles; ++j) {
            float acc = 0.0f;
            for (uint32_t k = 0; k < kLaneItems; ++k) {
                const uint32_t i = j * kTile + k * kLanes + l;
                if (i >= uint32_t(n)) break;
                const int x = from + int(i);
                acc = acc + det_exp((final_row ? masked(x) : ruled(x)) - m);
            }
            const float tile = lane_tree(acc, sh);
            if (l == 0) sh_tiles[j] = tile;
        }
        __syncthreads();
        return lane_tree(l < tiles ? sh_tiles[l] : 0.0f, sh);
    }
};

__global__ void mask_logits_kernel(MaskLaunch t) {
    __shared__ float sh[kLanes], sh_tiles[kLanes];
    const uint32_t r = blockIdx.x, l = threadIdx.x;
    const int n = int(t.V);
    float* row = t.logits + size_t(r) * t.V;
    MaskedRow s{t,
                row,
                t.words[kMaskWordStateCount],
                t.words[kMaskWordStateLast],
                t.words[kMaskWordStatePenultimate],
                t.words[kMaskWordStateLastMarked]};
    for (uint32_t i = 0; i < t.first_row + r; ++i)
        s.after(t.drafts[i]);
    s.settle();

    // Where the tokens from outweigh_begin together are likelier than any one below, one of
    // them it is.
    if (s.outweigh_begin >= 0) {
        const int ob = min(s.outweigh_begin, n);
        float above_max = -INFINITY, below_max = -INFINITY;
        for (int x = int(l); x < n; x += int(kLanes)) {
            const float z = s.ruled(x);
            if (x >= ob)
                above_max = fmaxf(above_max, z);
            else
                below_max = fmaxf(below_max, z);
        }
        above_max = block_max(above_max, sh);
        below_max = block_max(below_max, sh);
        if (above_max != -INFINITY && below_max != -INFINITY) {
            const float above_sum = s.sum_exp(ob, n - ob, above_max, false, sh, sh_tiles);
            s.outweighed = det_log(above_sum) + above_max > below_max;
        }
    }

    float lse = 0.0f;
    if (t.log_sum_exp != nullptr) {
        float m = -INFINITY;
        for (int x = int(l); x < n; x += int(kLanes))
            m = fmaxf(m, s.masked(x));
        m = block_max(m, sh);
        if (m == -INFINITY) {
            lse = -INFINITY;
        } else {
            const float sum = s.sum_exp(0, n, m, true, sh, sh_tiles);
            lse = sum > 0.0f ? m + det_log(sum) : m;  // an infinite max: no finite sum
        }
    }
    // A thread writes only the columns it reads (a tile is whole lanes), after every reduction.
    for (int x = int(l); x < n; x += int(kLanes))
        row[x] = s.masked(x);
    if (t.log_sum_exp != nullptr && l == 0) t.log_sum_exp[r] = lse;
}

Ctx context(const DecodeLaunch& d) {
    Ctx c{d, verify_rows_per_sequence(d.gamma, d.greedy), verify_tiles(d.V)};
    return c;
}

}  // namespace

size_t decode_scratch_words(const DecodeLaunch& d) {
    const Ctx c = context(d);
    return verify_scratch_words(d.batch * c.rows_per_seq, c.tiles, d.batch);
}

void verify(cudaStream_t s, const DecodeLaunch& d) {
    const Ctx c = context(d);
    const unsigned rows = d.batch * c.rows_per_seq;
    tile_max_kernel<<<rows * c.tiles, kLanes, 0, s>>>(c);
    if (d.greedy) {
        accept_kernel<<<d.batch, 1, 0, s>>>(c);
        return;
    }
    row_max_kernel<<<rows, kLanes, 0, s>>>(c);
    if (!d.filtered) tile_sum_kernel<<<rows * c.tiles, kLanes, 0, s>>>(c);
    row_norm_kernel<<<rows, kLanes, 0, s>>>(c);
    accept_kernel<<<d.batch, 1, 0, s>>>(c);
    race_kernel<<<d.batch * c.tiles, kLanes, 0, s>>>(c);
    finish_kernel<<<d.batch, 1, 0, s>>>(c);
}

void mask_logits(cudaStream_t s, const MaskLaunch& t) {
    if (t.rows == 0) return;  // an empty grid is a launch error
    mask_logits_kernel<<<t.rows, kLanes, 0, s>>>(t);
}

}  // namespace specula::cuda
