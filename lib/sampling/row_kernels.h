// The sampling arithmetic over whole rows of logits, vectorised with Google Highway and
// dispatched at run time like the cpu backend's kernels. Each function computes exactly what
// the scalar definitions give (core/detmath.h, core/philox.h, sampling.cpp), bit for bit on
// every instruction set: a lane does for one token what the scalar loop does, with the same
// operations in the same order and no fused multiply-add, and sums keep the canonical order.
// A draw over a whole vocabulary is what plain sampling and every verify pass do per row, so
// its cost is weighed against a forward of the model (docs/DESIGN.md "Sampling and random
// numbers").
#pragma once

#include <cstdint>

namespace specula::rows {

// A row as the processed distribution sees it: s(x) = z[x] * inv_t; x is kept when
// order_key(s) > cut_key, or == cut_key and x <= cut_id (the defaults keep every token);
// p(x) = exp_nonpositive(s - max) * inv_sum for kept x, else 0.
struct Row {
    const float* z = nullptr;
    float inv_t = 1.0f;
    float max = 0.0f;
    uint32_t cut_key = 0;
    uint32_t cut_id = UINT32_MAX;
    float inv_sum = 1.0f;
};

// The largest order key of z[x] * scale over x < n, as a signed integer (order_key - 2^31).
int32_t max_signed_key(const float* z, uint32_t n, float scale);

// The float whose signed order key is k (max_signed_key's, order_keys' results).
float from_signed_key(int32_t k);
// The value of the largest order key of z[x] * scale over x < n: the maximum when z has no NaN
// (keys rank NaNs beyond the infinities); -infinity when n is 0.
float max_value(const float* z, uint32_t n, float scale);

// The lowest x < n with z[x] == v (so -0 finds +0, and NaN nothing), or n: std::find's answer.
uint32_t first_equal(const float* z, uint32_t n, float v);

// keys[x] = order_key(z[x] * scale) for x < n; returns the largest as max_signed_key does.
int32_t order_keys(const float* z, uint32_t n, float scale, uint32_t* keys);

// maxima[j] = the largest of keys[x] over x < n with x % m == j (unsigned), for j < m <= n:
// the maxima of m disjoint sets of ids, each spread over the whole row.
void strided_maxima(const uint32_t* keys, uint32_t n, uint32_t m, uint32_t* maxima);

// The ids x < n with keys[x] >= least (unsigned), ascending, into out (room for n + 64
// ids: a vector's store may write past the last one); returns their number.
uint32_t ids_with_key_at_least(const uint32_t* keys, uint32_t n, uint32_t least, uint32_t* out);

// det::canonical_sum over x < n of exp_nonpositive(s(x) - row.max) for kept x (0 elsewhere):
// the row's mass before 1 / sum.
float kept_weight_sum(const Row& row, uint32_t n);

// The two exponential races of residual_race() (sampling.h) over every x < n: a over
// a(x) = max(0, p(x) - q(x)) (q = 0 without a q row), b over p(x), each the lowest id of the
// largest score; -1 where no token took part.
struct Races {
    int32_t best_a = -1, best_p = -1;
};
Races residual_races(const Row& p, const Row* q, uint32_t n, uint64_t seed, uint32_t stream,
                     uint32_t step, uint32_t row);

}  // namespace specula::rows
