#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "format/quant.h"

namespace specula {

size_t Tensor::row_bytes() const {
    const GgmlTypeTraits* t = ggml_type_traits(type);
    return size_t(cols) / t->block_size * t->block_bytes;
}

Status check_weight_type(const Backend& backend, const std::string& tensor, GgmlType type,
                         Backend::Op op) {
    if (backend.supports(op, type)) return Status::Ok();
    std::string runs;
    for (GgmlType t : kWeightTypes)
        if (backend.supports(op, t))
            runs += (runs.empty() ? "" : ", ") + std::string(ggml_type_name(t));
    return Unsupported("tensor '" + tensor + "' has type " + ggml_type_name(type) + ", which the " +
                       specula_backend_kind_name(backend.info().kind) + " backend does not " +
                       (op == Backend::Op::kGetRows ? "read rows of" : "run") + " (it " +
                       (op == Backend::Op::kGetRows ? "reads " : "runs ") + runs + ")");
}

void Backend::parallel_for_host(size_t n, const std::function<void(size_t, size_t)>& fn) {
    if (n > 0) fn(0, n);
}

Tensor Tensor::row_range(int64_t first, int64_t count) const {
    Tensor v = *this;
    v.offset += size_t(first) * row_bytes();
    v.rows = count;
    return v;
}

Backend::MatmulInput Backend::normed(const Tensor& x, const Tensor& weight, float eps,
                                     const Tensor& out) {
    rms_norm(x, weight, eps, out);
    return out;
}

Tensor Backend::apply_norm(const MatmulInput& x) {
    if (!x.has_norm()) return x.x;
    rms_norm(x.x, x.norm, x.eps, x.scratch);
    return x.scratch;
}

void Backend::matmul_gated(Activation act, const Tensor& w_gate, const Tensor& w_up,
                           const MatmulInput& input, const Tensor& out, const Tensor& up) {
    const Tensor x = apply_norm(input);
    matmul(w_gate, x, out, Accumulate::kNo);
    matmul(w_up, x, up, Accumulate::kNo);
    gated_mul(act, out, up, out);
}

void Backend::mask_logits(const MaskArgs& a) {
    const auto V = int(a.logits.cols);
    const auto rows = size_t(a.logits.rows);
    const size_t n_drafts = size_t(a.first_row) + rows - 1;
    std::vector<int32_t> drafts(n_drafts);
    std::vector<float> logits(rows * size_t(V)), lse(a.log_sum_exp.buffer != nullptr ? rows : 0);
    Tensor ids = a.drafts;
    ids.cols = int64_t(n_drafts);
    ids.rows = 1;
    // A failed read leaves the backend failed: the step's own wait reports it.
    if (n_drafts > 0 && !download(ids, drafts.data()).ok()) return;
    if (!download(a.logits, logits.data()).ok()) return;
    apply_mask_program_to_step(a.program, a.state, drafts, a.first_row, logits, V, lse);
    upload(a.logits, logits.data());
    if (!lse.empty()) {
        Tensor out = a.log_sum_exp;
        out.cols = int64_t(rows);
        out.rows = 1;
        upload(out, lse.data());
    }
}

void Backend::matmul_rope(const Tensor& w, const MatmulInput& x, const Tensor& out, const Rope& r) {
    matmul(w, x, out, Accumulate::kNo);
    rope(out, r.positions, r.table, r.head_dim, r.n_rot);
}

std::vector<float> rope_table(int n_ctx, int n_rot, float base, float freq_scale,
                              std::span<const float> freq_factors, float magnitude) {
    std::vector<float> table(size_t(n_ctx) * size_t(n_rot));
    for (int pos = 0; pos < n_ctx; ++pos) {
        for (int j = 0; j < n_rot / 2; ++j) {
            const double factor = freq_factors.empty() ? 1.0 : double(freq_factors[size_t(j)]);
            const double theta = double(pos) * double(freq_scale) *
                                 std::pow(double(base), -2.0 * j / n_rot) / factor;
            table[size_t(pos) * size_t(n_rot) + size_t(2 * j)] =
                float(double(magnitude) * std::cos(theta));
            table[size_t(pos) * size_t(n_rot) + size_t(2 * j) + 1] =
                float(double(magnitude) * std::sin(theta));
        }
    }
    return table;
}

Status choose_device(std::span<const specula_device_info> devices,
                     const specula_backend_params& params, const char* api, size_t* index) {
    if (devices.empty()) return {SPECULA_ERR_NO_DEVICE, std::string("no ") + api + " device"};
    *index = 0;
    if (params.device_index >= 0) {
        if (size_t(params.device_index) >= devices.size())
            return {SPECULA_ERR_NO_DEVICE,
                    std::string(api) + " device index " + std::to_string(params.device_index) +
                        " does not exist (" + std::to_string(devices.size()) + " found)"};
        *index = size_t(params.device_index);
    } else if (params.device_name != nullptr && params.device_name[0] != '\0') {
        auto it = std::find_if(devices.begin(), devices.end(), [&](const specula_device_info& d) {
            return std::strstr(d.name, params.device_name) != nullptr;
        });
        if (it == devices.end())
            return {SPECULA_ERR_NO_DEVICE,
                    std::string("no ") + api + " device named like '" + params.device_name + "'"};
        *index = size_t(it - devices.begin());
    }
    return Status::Ok();
}

}  // namespace specula
