// Highway compiles this file once per instruction set (foreach_target.h) and
// HWY_DYNAMIC_DISPATCH calls the best one the machine supports (or the one SPECULA_CPU_SIMD
// names: the choice is Highway's, for the whole process).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "sampling/row_kernels.cpp"
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include "core/detmath.h"
#include "core/philox.h"
#include "sampling/row_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace specula::rows {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;
using VU = hn::Vec<DU>;

HWY_INLINE VF Bits(uint32_t b) {
    return hn::BitCast(DF(), hn::Set(DU(), b));
}

// det::order_key(s) - 2^31: the float's bits, the magnitude bits flipped for negatives.
HWY_INLINE VI SignedKey(VF s) {
    const DI di;
    const VI b = hn::BitCast(di, s);
    return hn::Xor(b, hn::And(hn::ShiftRight<31>(b), hn::Set(di, 0x7FFFFFFF)));
}

// det::exp_nonpositive, lane by lane.
HWY_INLINE VF ExpNonpositive(VF x) {
    const DF df;
    const DI di;
    const auto valid = hn::Ge(x, hn::Set(df, det::kExpCutoff));  // false for NaN
    x = hn::IfThenElseZero(valid, x);  // the others' result is dropped; keep them finite
    const VF k = hn::Floor(hn::Add(hn::Mul(x, hn::Set(df, det::kLog2E)), hn::Set(df, 0.5f)));
    const VF r = hn::Sub(hn::Sub(x, hn::Mul(k, hn::Set(df, det::kLn2Hi))),
                         hn::Mul(k, hn::Set(df, det::kLn2Lo)));
    VF p = Bits(det::kExpTaylor[0]);
    for (int i = 1; i < 6; ++i)
        p = hn::Add(hn::Mul(p, r), Bits(det::kExpTaylor[i]));
    p = hn::Add(hn::Mul(p, r), hn::Set(df, 1.0f));
    p = hn::Add(hn::Mul(p, r), hn::Set(df, 1.0f));
    const VF scale =
        hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, k), hn::Set(di, 127))));
    return hn::IfThenElseZero(valid, hn::Mul(p, scale));
}

// det::reciprocal.
HWY_INLINE VF Reciprocal(VF z) {
    const DF df;
    const DI di;
    VF r = hn::BitCast(df, hn::Sub(hn::Set(di, int32_t(shared::kRecipMagic)), hn::BitCast(di, z)));
    for (int i = 0; i < 4; ++i)
        r = hn::Mul(r, hn::Sub(hn::Set(df, 2.0f), hn::Mul(z, r)));
    return r;
}

// det::log_positive.
HWY_INLINE VF LogPositive(VF u) {
    const DF df;
    const DI di;
    const VI b = hn::BitCast(di, u);
    VI e = hn::Sub(hn::ShiftRight<23>(b), hn::Set(di, 127));
    VF f = hn::BitCast(
        df, hn::Or(hn::And(b, hn::Set(di, 0x007FFFFF)), hn::Set(di, int32_t(0x3F800000))));
    const auto big = hn::Gt(f, hn::Set(df, det::kSqrt2));
    f = hn::IfThenElse(big, hn::Mul(f, hn::Set(df, 0.5f)), f);
    e = hn::IfThenElse(hn::RebindMask(di, big), hn::Add(e, hn::Set(di, 1)), e);
    const VF y = hn::Sub(f, hn::Set(df, 1.0f));
    const VF t = hn::Mul(y, Reciprocal(hn::Add(y, hn::Set(df, 2.0f))));
    const VF t2 = hn::Mul(t, t);
    VF s = Bits(det::kAtanhSeries[0]);
    for (int i = 1; i < 5; ++i)
        s = hn::Add(hn::Mul(s, t2), Bits(det::kAtanhSeries[i]));
    s = hn::Add(hn::Mul(s, t2), hn::Set(df, 1.0f));
    const VF ef = hn::ConvertTo(df, e);
    const VF low = hn::Add(hn::Mul(hn::Add(t, t), s), hn::Mul(ef, hn::Set(df, det::kLn2Lo)));
    return hn::Add(hn::Mul(ef, hn::Set(df, det::kLn2Hi)), low);
}

// philox_uniform(seed, stream, step, row, x) for the lanes' elements x of K vectors, their
// rounds interleaved (each round is a chain of dependent multiplies).
template <int K>
HWY_INLINE void PhiloxUniforms(const VU* x, uint64_t seed, uint32_t stream, uint32_t step,
                               uint32_t row, VF* u) {
    const DF df;
    const DU du;
    VU word[K];
#if HWY_TARGET == HWY_SCALAR
    for (int j = 0; j < K; ++j)
        word[j] = hn::Set(du, philox4x32_10({hn::GetLane(x[j]), row, step, stream},
                                            {uint32_t(seed), uint32_t(seed >> 32)})[0]);
#else
    const hn::Repartition<uint64_t, DU> d64;
    // The high and low words of k * c for each lane, from the products of the even lanes
    // and of the odd lanes moved down.
    const auto wide = [&](uint32_t k, VU c, VU* hi, VU* lo) {
        const VU kv = hn::Set(du, k);
        const auto even = hn::MulEven(kv, c);
        const auto odd = hn::MulEven(kv, hn::BitCast(du, hn::ShiftRight<32>(hn::BitCast(d64, c))));
        *hi = hn::OddEven(hn::BitCast(du, odd), hn::BitCast(du, hn::ShiftRight<32>(even)));
        *lo = hn::OddEven(hn::BitCast(du, hn::ShiftLeft<32>(odd)), hn::BitCast(du, even));
    };
    VU c0[K], c1[K], c2[K], c3[K];
    for (int j = 0; j < K; ++j) {
        c0[j] = x[j];
        c1[j] = hn::Set(du, row);
        c2[j] = hn::Set(du, step);
        c3[j] = hn::Set(du, stream);
    }
    uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
    for (int round = 0; round < 10; ++round) {
        for (int j = 0; j < K; ++j) {
            VU hi0, lo0, hi1, lo1;
            wide(shared::kPhiloxMul0, c0[j], &hi0, &lo0);
            wide(shared::kPhiloxMul1, c2[j], &hi1, &lo1);
            c0[j] = hn::Xor(hn::Xor(hi1, c1[j]), hn::Set(du, k0));
            c1[j] = lo1;
            c2[j] = hn::Xor(hn::Xor(hi0, c3[j]), hn::Set(du, k1));
            c3[j] = lo0;
        }
        k0 += shared::kPhiloxWeyl0;
        k1 += shared::kPhiloxWeyl1;
    }
    for (int j = 0; j < K; ++j)
        word[j] = c0[j];
#endif
    // uniform_from_bits: 23 bits centred in their cell.
    for (int j = 0; j < K; ++j) {
        const VF bits23 = hn::ConvertTo(df, hn::BitCast(DI(), hn::ShiftRight<9>(word[j])));
        u[j] = hn::Mul(hn::Add(bits23, hn::Set(df, 0.5f)),
                       hn::BitCast(df, hn::Set(du, shared::kBitsTwoToMinus23)));
    }
}

// A row's logits at x..x + lanes as a vector: whole vectors loaded, the last partial one
// padded with zeros (its lanes past n are masked by the callers).
HWY_INLINE VF LoadRow(const float* z, uint32_t x, uint32_t n) {
    const DF df;
    if (x + hn::Lanes(df) <= n) return hn::LoadU(df, z + x);
    HWY_ALIGN float tail[hn::MaxLanes(df)] = {};
    std::copy(z + x, z + n, tail);
    return hn::Load(df, tail);
}

// The ids x + lane of a vector's elements. (Highway 1.0's Iota goes through memory lane by
// lane: the lane numbers are made once.)
struct Ids {
    VI lanes;
    // Written out: GCC compiles an implicit constructor without the target's options.
    HWY_INLINE Ids() : lanes(hn::Iota(DI(), 0)) {}
    HWY_INLINE VI at(uint32_t x) const { return hn::Add(lanes, hn::Set(DI(), int32_t(x))); }
};

// Which lanes (elements x + lane) are kept by the row's cut and lie below n.
struct Cut {
    VI key, id;
    int32_t n;
    explicit Cut(const Row& r, uint32_t n_)
        : key(hn::Set(DI(), int32_t(r.cut_key ^ 0x80000000u))),
          id(hn::Set(DI(), int32_t(std::min<uint32_t>(r.cut_id, 0x7FFFFFFFu)))),
          n(int32_t(n_)) {}
    HWY_INLINE auto kept(VI signed_key, VI ids) const {
        const auto in = hn::Lt(ids, hn::Set(DI(), n));
        // key == cut key and not id > cut id (Highway 1.0 has no <= of integers)
        const auto tie = hn::AndNot(hn::Gt(ids, id), hn::Eq(signed_key, key));
        return hn::And(in, hn::Or(hn::Gt(signed_key, key), tie));
    }
};

// p(x) of the row at the lanes' elements (0 where not kept).
HWY_INLINE VF Processed(const Row& r, const Cut& cut, const Ids& ids, uint32_t x, uint32_t n) {
    const DF df;
    const VF s = hn::Mul(LoadRow(r.z, x, n), hn::Set(df, r.inv_t));
    const auto kept = cut.kept(SignedKey(s), ids.at(x));
    const VF e = ExpNonpositive(hn::Sub(s, hn::Set(df, r.max)));
    return hn::IfThenElseZero(hn::RebindMask(df, kept), hn::Mul(e, hn::Set(df, r.inv_sum)));
}

int32_t MaxSignedKey(const float* z, uint32_t n, float scale) {
    const DF df;
    const DI di;
    const uint32_t L = uint32_t(hn::Lanes(df));
    VI best = hn::Set(di, INT32_MIN);
    uint32_t x = 0;
    for (; x + L <= n; x += L)
        best = hn::Max(best, SignedKey(hn::Mul(hn::LoadU(df, z + x), hn::Set(df, scale))));
    int32_t m = hn::GetLane(hn::MaxOfLanes(di, best));
    for (; x < n; ++x) {
        const auto b = int32_t(det::to_bits(z[x] * scale));
        m = std::max(m, b ^ ((b >> 31) & 0x7FFFFFFF));
    }
    return m;
}

uint32_t FirstEqual(const float* z, uint32_t n, float v) {
    const DF df;
    const uint32_t L = uint32_t(hn::Lanes(df));
    const VF value = hn::Set(df, v);
    uint32_t x = 0;
    for (; x + L <= n; x += L) {
        const intptr_t i = hn::FindFirstTrue(df, hn::Eq(hn::LoadU(df, z + x), value));
        if (i >= 0) return x + uint32_t(i);
    }
    for (; x < n; ++x)
        if (z[x] == v) return x;
    return n;
}

int32_t OrderKeys(const float* z, uint32_t n, float scale, uint32_t* keys) {
    const DF df;
    const DI di;
    const uint32_t L = uint32_t(hn::Lanes(df));
    const VI flip = hn::Set(di, INT32_MIN);
    VI best = flip;
    uint32_t x = 0;
    for (; x + L <= n; x += L) {
        const VI k = SignedKey(hn::Mul(hn::LoadU(df, z + x), hn::Set(df, scale)));
        best = hn::Max(best, k);
        hn::StoreU(hn::BitCast(DU(), hn::Xor(k, flip)), DU(), keys + x);
    }
    int32_t m = hn::GetLane(hn::MaxOfLanes(di, best));
    for (; x < n; ++x) {
        keys[x] = det::order_key(z[x] * scale);
        m = std::max(m, int32_t(keys[x] ^ 0x80000000u));
    }
    return m;
}

void StridedMaxima(const uint32_t* keys, uint32_t n, uint32_t m, uint32_t* maxima) {
    const DI di;
    const uint32_t L = uint32_t(hn::Lanes(di));
    const int32_t flip = INT32_MIN;
    // Unsigned maxima by the signed order (keys - 2^31), which every target compares: kept
    // flipped in `maxima` until the end.
    std::fill(maxima, maxima + m, uint32_t(flip));
    for (uint32_t begin = 0; begin < n; begin += m) {
        const uint32_t len = std::min(m, n - begin);
        uint32_t j = 0;
        for (; j + L <= len; j += L) {
            auto* to = reinterpret_cast<int32_t*>(maxima + j);
            const VI k =
                hn::Xor(hn::BitCast(di, hn::LoadU(DU(), keys + begin + j)), hn::Set(di, flip));
            hn::StoreU(hn::Max(hn::LoadU(di, to), k), di, to);
        }
        for (; j < len; ++j)
            maxima[j] =
                uint32_t(std::max(int32_t(maxima[j]), int32_t(keys[begin + j] ^ 0x80000000u)));
    }
    for (uint32_t j = 0; j < m; ++j)
        maxima[j] ^= 0x80000000u;
}

uint32_t IdsWithKeyAtLeast(const uint32_t* keys, uint32_t n, uint32_t least, uint32_t* out) {
    const DI di;
    const uint32_t L = uint32_t(hn::Lanes(di));
    const VI flip = hn::Set(di, INT32_MIN);
    const VI bound = hn::Set(di, int32_t(least ^ 0x80000000u));
    const Ids ids;
    uint32_t count = 0, x = 0;
    for (; x + L <= n; x += L) {
        const VI k = hn::Xor(hn::BitCast(di, hn::LoadU(DU(), keys + x)), flip);
        const auto take = hn::Not(hn::Lt(k, bound));
        if (hn::AllFalse(di, take)) continue;
        // Compress in registers, then a plain store: the compressing store to memory is
        // microcoded on some CPUs (AMD Zen 4: ~30x slower).
        hn::StoreU(hn::Compress(ids.at(x), take), di, reinterpret_cast<int32_t*>(out + count));
        count += uint32_t(hn::CountTrue(di, take));
    }
    for (; x < n; ++x)
        if (keys[x] >= least) out[count++] = x;
    return count;
}

float KeptWeightSum(const Row& row, uint32_t n) {
    const DF df;
    const uint32_t L = uint32_t(hn::Lanes(df));
    const Cut cut(row, n);
    const Ids ids;
    const Row weights{row.z, row.inv_t, row.max, row.cut_key, row.cut_id, 1.0f};
    // det::canonical_sum: lane l of tile t adds elements t * kTile + k * kLanes + l for k in
    // order; a vector takes L neighbouring lanes. Elements past n add +0, which changes no
    // partial sum (all are >= +0): the same as the definition's early stop.
    std::array<float, det::kLanes> tiles{};
    HWY_ALIGN std::array<float, det::kLanes> lanes{};
    const uint32_t n_tiles = (n + det::kTile - 1) / det::kTile;
    for (uint32_t t = 0; t < n_tiles; ++t) {
        for (uint32_t l = 0; l < det::kLanes; l += L) {
            VF acc = hn::Zero(df);
            for (uint32_t k = 0; k < det::kLaneItems; ++k) {
                const uint32_t x = t * det::kTile + k * det::kLanes + l;
                if (x >= n) break;
                acc = hn::Add(acc, Processed(weights, cut, ids, x, n));
            }
            hn::Store(acc, df, lanes.data() + l);
        }
        // det::lane_tree, the strides of whole vectors as vectors.
        uint32_t stride = det::kLanes / 2;
        for (; stride >= L; stride /= 2)
            for (uint32_t l = 0; l < stride; l += L)
                hn::Store(hn::Add(hn::Load(df, lanes.data() + l),
                                  hn::Load(df, lanes.data() + l + stride)),
                          df, lanes.data() + l);
        for (; stride > 0; stride /= 2)
            for (uint32_t l = 0; l < stride; ++l)
                lanes[l] = lanes[l] + lanes[l + stride];
        tiles[t] = lanes[0];
    }
    return det::lane_tree(tiles);
}

Races ResidualRaces(const Row& p, const Row* q, uint32_t n, uint64_t seed, uint32_t stream,
                    uint32_t step, uint32_t row) {
    const DF df;
    const DI di;
    const uint32_t L = uint32_t(hn::Lanes(df));
    const Cut p_cut(p, n);
    const Cut q_cut(q ? *q : Row{}, n);
    const Ids lane_ids;
    // Per lane: the best score and its id of each race, lanes taking their elements in
    // increasing order and replacing only on a strictly larger score (the lowest id of a
    // lane's maximum). A race's first candidate always takes the place: a > 0 beats 0, and
    // p's race takes any candidate (b >= 0 beats -1).
    VF score_a = hn::Zero(df), score_p = hn::Set(df, -1.0f);
    VI id_a = hn::Set(di, -1), id_p = hn::Set(di, -1);
    const VF zero = hn::Zero(df), one = hn::Set(df, 1.0f), slack = hn::Set(df, det::kRaceSlack);
    // K vectors of tokens at a time: their chains of dependent arithmetic interleave.
    constexpr int K = 2;
    for (uint32_t x0 = 0; x0 < n; x0 += K * L) {
        VF px[K], qx[K], u[K];
        VU ids[K];
        bool any = false;
        for (int j = 0; j < K; ++j) {
            const uint32_t x = std::min(x0 + uint32_t(j) * L, n);  // past n: no lane kept
            px[j] = Processed(p, p_cut, lane_ids, x, n);
            qx[j] = q ? Processed(*q, q_cut, lane_ids, x, n) : zero;
            ids[j] = hn::BitCast(DU(), lane_ids.at(x));
            any = any || !hn::AllFalse(df, hn::Gt(px[j], zero));
        }
        if (!any) continue;
        PhiloxUniforms<K>(ids, seed, stream, step, row, u);
        for (int j = 0; j < K; ++j) {
            const auto candidate = hn::Gt(px[j], zero);  // kept, below n, and p(x) > 0
            const VF d = hn::Sub(px[j], qx[j]);
            const VF ax = hn::IfThenElseZero(hn::Lt(zero, d), d);  // max(0, p - q)
            // det::race_cannot_win against each lane's own best: where no lane can win either
            // race, the log and reciprocal of the weights are spared (no result changes: a
            // skipped score is below its lane's best, which only a larger score replaces).
            const VF bound = hn::Mul(hn::Sub(one, u[j]), slack);
            const auto may_a =
                hn::And(hn::Gt(ax, zero), hn::Not(hn::Lt(ax, hn::Mul(score_a, bound))));
            const auto may_p = hn::And(candidate, hn::Not(hn::Lt(px[j], hn::Mul(score_p, bound))));
            if (hn::AllFalse(df, hn::Or(may_a, may_p))) continue;
            const VF w = Reciprocal(hn::Neg(LogPositive(u[j])));  // det::race_weight
            const VF a = hn::Mul(ax, w);
            const VF b = hn::Mul(px[j], w);
            const auto take_a = hn::And(candidate, hn::Gt(a, score_a));
            const auto take_p = hn::And(candidate, hn::Gt(b, score_p));
            const VI id = hn::BitCast(di, ids[j]);
            score_a = hn::IfThenElse(take_a, a, score_a);
            id_a = hn::IfThenElse(hn::RebindMask(di, take_a), id, id_a);
            score_p = hn::IfThenElse(take_p, b, score_p);
            id_p = hn::IfThenElse(hn::RebindMask(di, take_p), id, id_p);
        }
    }
    // Across lanes: the largest score, the lowest id among lanes holding it.
    const auto best = [&](VF score, VI id) {
        HWY_ALIGN float s[hn::MaxLanes(df)];
        HWY_ALIGN int32_t i[hn::MaxLanes(df)];
        hn::Store(score, df, s);
        hn::Store(id, di, i);
        int32_t best_id = -1;
        float best_score = 0.0f;
        for (uint32_t l = 0; l < L; ++l) {
            if (i[l] < 0) continue;
            if (best_id < 0 || s[l] > best_score || (s[l] == best_score && i[l] < best_id)) {
                best_id = i[l];
                best_score = s[l];
            }
        }
        return best_id;
    };
    return {best(score_a, id_a), best(score_p, id_p)};
}

}  // namespace HWY_NAMESPACE
}  // namespace specula::rows
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace specula::rows {

HWY_EXPORT(MaxSignedKey);
HWY_EXPORT(FirstEqual);
HWY_EXPORT(OrderKeys);
HWY_EXPORT(StridedMaxima);
HWY_EXPORT(KeptWeightSum);
HWY_EXPORT(IdsWithKeyAtLeast);
HWY_EXPORT(ResidualRaces);

int32_t max_signed_key(const float* z, uint32_t n, float scale) {
    return HWY_DYNAMIC_DISPATCH(MaxSignedKey)(z, n, scale);
}
uint32_t first_equal(const float* z, uint32_t n, float v) {
    return HWY_DYNAMIC_DISPATCH(FirstEqual)(z, n, v);
}
float from_signed_key(int32_t k) {
    return det::from_bits(uint32_t(k >= 0 ? k : k ^ 0x7FFFFFFF));
}
float max_value(const float* z, uint32_t n, float scale) {
    return n == 0 ? -std::numeric_limits<float>::infinity()
                  : from_signed_key(max_signed_key(z, n, scale));
}
int32_t order_keys(const float* z, uint32_t n, float scale, uint32_t* keys) {
    return HWY_DYNAMIC_DISPATCH(OrderKeys)(z, n, scale, keys);
}
void strided_maxima(const uint32_t* keys, uint32_t n, uint32_t m, uint32_t* maxima) {
    HWY_DYNAMIC_DISPATCH(StridedMaxima)(keys, n, m, maxima);
}
uint32_t ids_with_key_at_least(const uint32_t* keys, uint32_t n, uint32_t least, uint32_t* out) {
    return HWY_DYNAMIC_DISPATCH(IdsWithKeyAtLeast)(keys, n, least, out);
}
float kept_weight_sum(const Row& row, uint32_t n) {
    return HWY_DYNAMIC_DISPATCH(KeptWeightSum)(row, n);
}
Races residual_races(const Row& p, const Row* q, uint32_t n, uint64_t seed, uint32_t stream,
                     uint32_t step, uint32_t row) {
    return HWY_DYNAMIC_DISPATCH(ResidualRaces)(p, q, n, seed, stream, step, row);
}

}  // namespace specula::rows
#endif  // HWY_ONCE
