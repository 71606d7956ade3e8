#include "cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "backend/options.h"
#include "core/detmath.h"
#include "format/quant.h"
#include "kernels.h"
#include "sampling/mask_program.h"

namespace specula {

namespace {

Status cuda_status(cudaError_t e, const std::string& what) {
    // A failed call's error stays the thread's last error until it is read: read it here, or
    // the next op's launch check reports it again (an allocation refused for its size would
    // fail the next matmul).
    if (e != cudaSuccess) cudaGetLastError();
    switch (e) {
        case cudaSuccess:
            return Status::Ok();
        case cudaErrorMemoryAllocation:
            return OutOfMemory(what + ": out of device memory");
        case cudaErrorInsufficientDriver:
            return {SPECULA_ERR_NO_DEVICE,
                    what + ": no NVIDIA driver, or one older than this build's CUDA " +
                        std::to_string(CUDART_VERSION / 1000) + " runtime"};
        case cudaErrorNoDevice:
        case cudaErrorInitializationError:
        case cudaErrorNoKernelImageForDevice:
        case cudaErrorInvalidDevice:
            return {SPECULA_ERR_NO_DEVICE, what + ": " + cudaGetErrorString(e)};
        case cudaErrorLaunchFailure:
        case cudaErrorIllegalAddress:
        case cudaErrorECCUncorrectable:
        case cudaErrorDevicesUnavailable:
            return {SPECULA_ERR_DEVICE_LOST, what + ": " + cudaGetErrorString(e)};
        default:
            return {SPECULA_ERR_INTERNAL, what + ": " + cudaGetErrorString(e)};
    }
}

class CudaBuffer final : public Buffer {
  public:
    CudaBuffer(void* ptr, size_t size) : ptr_(ptr), size_(size) {}
    ~CudaBuffer() override { cudaFree(ptr_); }  // cudaFree waits for work using it
    CudaBuffer(const CudaBuffer&) = delete;
    CudaBuffer& operator=(const CudaBuffer&) = delete;
    size_t size() const override { return size_; }
    uint8_t* data() const { return static_cast<uint8_t*>(ptr_); }

  private:
    void* ptr_;
    size_t size_;
};

template <typename T = float>
T* dev(const Tensor& t) {
    return t.buffer ? reinterpret_cast<T*>(static_cast<CudaBuffer*>(t.buffer)->data() + t.offset)
                    : nullptr;
}

class CudaBackend final : public Backend {
  public:
    ~CudaBackend() override {
        if (stream_) {
            cudaSetDevice(device_);
            cudaStreamSynchronize(stream_);
            for (cudaEvent_t e : events_)
                if (e) cudaEventDestroy(e);
            cudaStreamDestroy(stream_);
        }
    }

    Status init(int device, const specula_device_info& info,
                const specula_backend_options& options) {
        info_ = info;
        device_ = device;
        SPECULA_TRY(cuda_status(cudaSetDevice(device), "cudaSetDevice"));
        SPECULA_TRY(cuda_status(
            cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, device),
            "cudaDeviceGetAttribute"));
        int major = 0;
        SPECULA_TRY(
            cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                        "cudaDeviceGetAttribute"));
        reads_.tensor_cores = major >= 8 && path_on(options.tensor_cores, false);
        reads_.staged = path_on(options.staged, true);
        split_attention_ = path_on(options.split_attention, true);
        tiled_ = path_on(options.tiled, true);
        host_rules_ = path_on(options.host_rules, false);
        fused_gate_ = path_on(options.fused_gate, true);
        fused_rope_ = path_on(options.fused_rope, true);
        int8_inputs_ = path_on(options.int8_inputs, true);
        SPECULA_TRY(cuda_status(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                                "cudaStreamCreate"));
        for (cudaEvent_t& e : events_)
            SPECULA_TRY(cuda_status(cudaEventCreate(&e), "cudaEventCreate"));
        return Status::Ok();
    }

    const specula_device_info& info() const override { return info_; }
    bool supports(Op op, GgmlType type) const override {
        const bool reads = std::find(std::begin(kWeightTypes), std::end(kWeightTypes), type) !=
                           std::end(kWeightTypes);
        switch (op) {
            case Op::kMatmulGated:
                return reads && fused_gate_;
            case Op::kMatmulRope:
                return reads && fused_rope_;
            case Op::kNormedMatmul:  // the norm is a kernel of its own (which quantizes the
                return false;        // matmuls' inputs where they take 8-bit ones)
            case Op::kMaskLogits:
                return !host_rules_;
            default:
                return reads;
        }
    }
    bool quantizes_inputs(GgmlType type, int64_t columns) const override {
        return int8_inputs_ && cuda::has_int_kernel(type) && !in_tiles(columns);
    }

    uint64_t available_memory() const override {
        size_t free = 0, total = 0;
        if (cudaSetDevice(device_) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess)
            return 0;
        return free;
    }

    Status allocate(size_t bytes, std::unique_ptr<Buffer>* out) override {
        SPECULA_TRY(usable());
        SPECULA_TRY(on_device());
        forget_quantized();  // the new buffer may take the place of a freed one
        void* p = nullptr;
        SPECULA_TRY(cuda_status(cudaMalloc(&p, std::max<size_t>(bytes, 16)),
                                "allocating " + std::to_string(bytes) + " bytes"));
        auto b = std::make_unique<CudaBuffer>(p, bytes);
        const cudaError_t e = cudaMemsetAsync(p, 0, std::max<size_t>(bytes, 16), stream_);
        if (e != cudaSuccess) return cuda_status(e, "cudaMemsetAsync");
        *out = std::move(b);
        return Status::Ok();
    }

    Status load_weights(std::span<const uint8_t> host, GgmlType /*type*/, int64_t /*cols*/,
                        int64_t /*rows*/, WeightUse /*use*/,
                        std::unique_ptr<Buffer>* out) override {
        std::unique_ptr<Buffer> b;
        SPECULA_TRY(allocate(host.size(), &b));
        SPECULA_TRY(
            cuda_status(cudaMemcpyAsync(static_cast<CudaBuffer*>(b.get())->data(), host.data(),
                                        host.size(), cudaMemcpyHostToDevice, stream_),
                        "copying weights"));
        SPECULA_TRY(flush());
        *out = std::move(b);
        return Status::Ok();
    }

    // A pageable source is staged by the driver before the call returns, so src may be
    // reused at once; the copy stays in stream order.
    void upload(const Tensor& dst, const void* src) override {
        if (dst.offset + dst.bytes() > dst.buffer->size())
            return fail(InvalidArgument("an upload reaches past the end of its buffer"));
        select();
        check(cudaMemcpyAsync(dev<uint8_t>(dst), src, dst.bytes(), cudaMemcpyHostToDevice, stream_),
              "upload");
    }

    Status download(const Tensor& src, void* dst) override {
        if (src.offset + src.bytes() > src.buffer->size())
            return InvalidArgument("a download reaches past the end of its buffer");
        SPECULA_TRY(on_device());
        check(cudaMemcpyAsync(dst, dev<uint8_t>(src), src.bytes(), cudaMemcpyDeviceToHost, stream_),
              "download");
        return flush();
    }

    Status flush() override {
        SPECULA_TRY(usable());
        SPECULA_TRY(on_device());
        const cudaError_t e = cudaStreamSynchronize(stream_);
        ++host_waits_;
        Status s = std::exchange(pending_, Status::Ok());
        if (e != cudaSuccess)
            return lose_if_fatal(cuda_status(e, "running work on the CUDA device"));
        return lose_if_fatal(std::move(s));
    }

    Status lose_if_fatal(Status s) {
        if (s.code() == SPECULA_ERR_DEVICE_LOST) lost_ = true;
        return s;
    }

    uint64_t host_waits() const override { return host_waits_; }

    void mark_time(int slot) override {
        select_device();
        check(cudaEventRecord(events_[size_t(slot)], stream_), "cudaEventRecord");
    }
    double seconds_between(int from, int to) const override {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, events_[size_t(from)], events_[size_t(to)]) != cudaSuccess)
            return 0.0;
        return double(ms) * 1e-3;
    }

    void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out) override {
        select();
        if (!cuda::get_rows(stream_, table.type, dev<uint8_t>(table), table.cols, dev<int32_t>(ids),
                            ids.cols * ids.rows, dev(out)))
            return fail(no_kernel(table.type));
        check(cudaGetLastError(), "get_rows");
    }
    void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) override {
        select();
        cuda::rms_norm(stream_, dev(x), dev(weight), eps, x.cols, x.rows, dev(out));
        check(cudaGetLastError(), "rms_norm");
    }
    // With 8-bit inputs, the norm's kernel quantizes what it writes too: the matmuls that read
    // it (q, k and v; gate and up) take it without a kernel of their own.
    MatmulInput normed(const Tensor& x, const Tensor& weight, float eps,
                       const Tensor& out) override {
        const int64_t count = x.cols * x.rows;
        if (!int8_inputs_ || in_tiles(x.rows) || x.cols % 32 != 0 || !reserve_quantized(count))
            return Backend::normed(x, weight, eps, out);
        select();
        cuda::rms_norm(stream_, dev(x), dev(weight), eps, x.cols, x.rows, dev(out), quantized_);
        check(cudaGetLastError(), "rms_norm");
        quantized_from_ = dev(out);
        quantized_count_ = count;
        return out;
    }
    void matmul(const Tensor& w, const MatmulInput& input, const Tensor& out,
                Accumulate accumulate) override {
        const Tensor x = apply_norm(input);
        if (!aligned(x, w)) return fail(unaligned());
        select_device();
        // Wider than a verification forward (which must be batch invariant): in tiles.
        const bool ok =
            in_tiles(x.rows)
                ? cuda::matmul_tiled(stream_, w.type, dev<uint8_t>(w), w.cols, w.rows, dev(x),
                                     x.rows, dev(out), out.cols, accumulate == Accumulate::kYes)
                : cuda::matmul(stream_, w.type, dev<uint8_t>(w), w.cols, w.rows, dev(x),
                               quantized(x, w.type), x.rows, dev(out), out.cols,
                               accumulate == Accumulate::kYes, reads_);
        wrote(out);
        if (!ok) return fail(no_kernel(w.type));
        check(cudaGetLastError(), "matmul");
    }
    void matmul_gated(Activation act, const Tensor& w_gate, const Tensor& w_up,
                      const MatmulInput& input, const Tensor& out, const Tensor& up) override {
        if (!fused_gate_ || w_gate.type != w_up.type || w_gate.cols != w_up.cols ||
            w_gate.rows != w_up.rows || out.cols != w_gate.rows || in_tiles(input.x.rows))
            return Backend::matmul_gated(act, w_gate, w_up, input, out, up);
        const Tensor x = apply_norm(input);
        if (!aligned(x, w_gate)) return fail(unaligned());
        select_device();
        const bool ok = cuda::matmul_gated(
            stream_, w_gate.type, uint32_t(act), dev<uint8_t>(w_gate), dev<uint8_t>(w_up),
            w_gate.cols, w_gate.rows, dev(x), quantized(x, w_gate.type), x.rows, dev(out), reads_);
        wrote(out);
        if (!ok) return fail(no_kernel(w_gate.type));
        check(cudaGetLastError(), "matmul_gated");
    }
    void matmul_rope(const Tensor& w, const MatmulInput& input, const Tensor& out,
                     const Rope& r) override {
        if (!fused_rope_ || out.cols != w.rows || r.head_dim % 2 != 0 || in_tiles(input.x.rows))
            return Backend::matmul_rope(w, input, out, r);
        const Tensor x = apply_norm(input);
        if (!aligned(x, w)) return fail(unaligned());
        select_device();
        const bool ok = cuda::matmul_rope(
            stream_, w.type, dev<uint8_t>(w), w.cols, w.rows, dev(x), quantized(x, w.type), x.rows,
            dev(out), dev<int32_t>(r.positions), dev(r.table), r.head_dim, r.n_rot, reads_);
        wrote(out);
        if (!ok) return fail(no_kernel(w.type));
        check(cudaGetLastError(), "matmul_rope");
    }
    void rope(const Tensor& x, const Tensor& positions, const Tensor& table, int head_dim,
              int n_rot) override {
        select();
        cuda::rope(stream_, dev(x), x.cols, x.rows, dev<int32_t>(positions), dev(table), head_dim,
                   n_rot);
        check(cudaGetLastError(), "rope");
    }
    void copy(const Tensor& src, const Tensor& dst) override {
        select();
        cuda::copy_f32(stream_, dev(src), src.cols * src.rows, dev(dst));
        check(cudaGetLastError(), "copy");
    }
    void attention(const Attention& a) override {
        if (a.head_dim > 256 || a.k.type != GgmlType::kF32 || a.v.type != GgmlType::kF32)
            return fail(
                Unsupported("CUDA attention needs F32 keys and values and heads up to 256"));
        select();
        // Fewer (row, head) pairs than the device has multiprocessors to spare, and keys in more
        // than one chunk (a decode step or a verification batch over a long context): split-K.
        // The most keys a row sees: the last row's (a window's span grows to it, then holds).
        const int rows = int(a.q.rows);
        const int max_keys = a.keys_seen(a.q.rows - 1) - a.first_key(a.q.rows - 1);
        float* partial = nullptr;
        if (split_attention_ && rows * a.n_head < 2 * multiprocessors_ &&
            max_keys > cuda::kAttentionChunkKeys) {
            const size_t bytes =
                size_t(cuda::attention_partial_floats(rows, a.n_head, a.head_dim, max_keys)) *
                sizeof(float);
            if (!attention_partial_ || attention_partial_->size() < bytes) {
                attention_partial_.reset();  // cudaFree waits for the work still using it
                std::unique_ptr<Buffer> b;
                if (Status s = allocate(bytes, &b); !s.ok()) return fail(std::move(s));
                attention_partial_.reset(static_cast<CudaBuffer*>(b.release()));
            }
            partial = reinterpret_cast<float*>(attention_partial_->data());
        }
        const cuda::AttentionShape shape{.n_head = a.n_head,
                                         .n_head_kv = a.n_head_kv,
                                         .head_dim = a.head_dim,
                                         .pos0 = a.pos0,
                                         .fixed_keys = a.n_keys,
                                         .window = a.window,
                                         .scale = a.scale,
                                         .soft_cap = a.soft_cap};
        cuda::attention(stream_, dev(a.q), dev(a.k), dev(a.v), dev(a.out), rows, shape, partial);
        check(cudaGetLastError(), "attention");
    }
    void gated_mul(Activation act, const Tensor& gate, const Tensor& up,
                   const Tensor& out) override {
        select();
        cuda::gated_mul(stream_, uint32_t(act), dev(gate), dev(up), gate.cols * gate.rows,
                        dev(out));
        check(cudaGetLastError(), "gated_mul");
    }
    void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                    const Tensor& out) override {
        select();
        cuda::layer_norm(stream_, dev(x), dev(weight), dev(bias), eps, x.cols, x.rows, dev(out));
        check(cudaGetLastError(), "layer_norm");
    }
    void activate(Activation act, const Tensor& x, const Tensor& out) override {
        select();
        cuda::activate(stream_, uint32_t(act), dev(x), x.cols * x.rows, dev(out));
        check(cudaGetLastError(), "activate");
    }
    void scale(const Tensor& x, float factor) override {
        select();
        cuda::scale(stream_, dev(x), factor, x.cols * x.rows);
        check(cudaGetLastError(), "scale");
    }
    void soft_cap(const Tensor& x, float cap) override {
        select();
        cuda::soft_cap(stream_, dev(x), cap, x.cols * x.rows);
        check(cudaGetLastError(), "soft_cap");
    }
    void round_to_half(const Tensor& x) override {
        select();
        cuda::round_to_half(stream_, dev(x), x.cols * x.rows);
        check(cudaGetLastError(), "round_to_half");
    }
    void add_bias(const Tensor& x, const Tensor& bias) override {
        select();
        // bias[i % period]: one row repeats, a whole tensor is read once.
        cuda::add_bias(stream_, dev(x), dev(bias), bias.rows > 1 ? x.cols * x.rows : x.cols,
                       x.cols * x.rows);
        check(cudaGetLastError(), "add_bias");
    }
    void im2col(const Tensor& x, const Convolution& conv, const Tensor& out) override {
        select();
        cuda::im2col(stream_, dev(x), x.cols, x.rows, {conv.kernel, conv.stride, conv.padding},
                     out.cols, out.rows, dev(out));
        check(cudaGetLastError(), "im2col");
    }
    void expand_columns(const Tensor& src, const Tensor& ids, float fill,
                        const Tensor& out) override {
        select();
        cuda::expand_columns(stream_, dev(src), src.cols, dev<int32_t>(ids), fill, out.cols,
                             out.rows, dev(out));
        check(cudaGetLastError(), "expand_columns");
    }
    void verify(const VerifyArgs& a) override {
        cuda::DecodeLaunch d;
        d.target = dev(a.target);
        d.draft = dev(a.draft);
        d.drafts = dev<int32_t>(a.drafts);
        d.result = dev<int32_t>(a.result);
        d.token = dev<int32_t>(a.token);
        d.V = uint32_t(a.target.cols);
        d.batch = uint32_t(a.batch);
        d.gamma = uint32_t(a.gamma);
        d.top_k = a.sampling.top_k > 0 ? uint32_t(a.sampling.top_k) : 0;
        d.stream = uint32_t(a.stream);
        d.step = a.step;
        d.row_offset = a.row_offset;
        d.seed = a.sampling.seed;
        d.inv_t = a.sampling.inv_temperature();
        d.top_p = a.sampling.nucleus();
        d.greedy = a.sampling.greedy();
        d.filtered = a.sampling.filtered(int(d.V));
        const size_t words = cuda::decode_scratch_words(d);
        if (!scratch_ || scratch_->size() < words * 4) {
            scratch_.reset();  // cudaFree waits for the passes still using it
            std::unique_ptr<Buffer> b;
            if (Status s = allocate(words * 4, &b); !s.ok()) return fail(std::move(s));
            scratch_.reset(static_cast<CudaBuffer*>(b.release()));
        }
        d.scratch = reinterpret_cast<uint32_t*>(scratch_->data());
        select();
        cuda::verify(stream_, d);
        check(cudaGetLastError(), "verify");
    }

    // On the device, so a speculative Whisper step keeps its one wait.
    void mask_logits(const MaskArgs& a) override {
        if (host_rules_) return Backend::mask_logits(a);
        cuda::MaskLaunch t;
        t.V = uint32_t(a.logits.cols);
        if (t.V > det::kMaxVocab)
            return fail(Unsupported("vocabularies above " + std::to_string(det::kMaxVocab) +
                                    " tokens are not supported on the device"));
        t.logits = dev(a.logits);
        t.drafts = dev<int32_t>(a.drafts);
        t.log_sum_exp = dev(a.log_sum_exp);
        t.rows = uint32_t(a.logits.rows);
        t.first_row = uint32_t(a.first_row);
        const auto words = program_words(a.program, a.state);
        std::copy(words.begin(), words.end(), t.words);
        select();
        cuda::mask_logits(stream_, t);
        check(cudaGetLastError(), "mask_logits");
    }

  private:
    // Work goes to this backend's device whichever device the calling thread used last (two
    // backends on two GPUs, one thread): every entry point that issues work selects it.
    Status on_device() const { return cuda_status(cudaSetDevice(device_), "cudaSetDevice"); }
    void select_device() { check(cudaSetDevice(device_), "cudaSetDevice"); }
    // Before an op that may write anywhere: the quantized input is stale after it.
    void select() {
        forget_quantized();
        select_device();
    }

    // x quantized to 8 bits for a matmul with weights of `type` (null: it multiplies the floats).
    // q, k and v (gate and up) read the same input: it is quantized once (or by normed()) and
    // kept until an op may have written it (select(), wrote()) or a buffer is allocated.
    const cuda::QuantizedInputs* quantized(const Tensor& x, GgmlType type) {
        if (!quantizes_inputs(type, x.rows)) return nullptr;
        const int64_t count = x.cols * x.rows;
        if (quantized_from_ == dev(x) && quantized_count_ == count) return &quantized_;
        if (!reserve_quantized(count)) return nullptr;
        cuda::quantize_inputs(stream_, dev(x), count, quantized_);
        check(cudaGetLastError(), "quantize_inputs");
        quantized_from_ = dev(x);
        quantized_count_ = count;
        return &quantized_;
    }
    // Room for `count` quantized values and their scales (false: the failure is recorded).
    bool reserve_quantized(int64_t count) {
        const size_t values = (size_t(count) + 15) / 16 * 16, bytes = values + size_t(count) / 8;
        if (!quantized_buffer_ || quantized_buffer_->size() < bytes) {
            quantized_buffer_.reset();  // cudaFree waits for the matmuls still reading it
            std::unique_ptr<Buffer> b;
            if (Status s = allocate(bytes, &b); !s.ok()) {
                fail(std::move(s));
                return false;
            }
            quantized_buffer_.reset(static_cast<CudaBuffer*>(b.release()));
            quantized_.q = reinterpret_cast<int8_t*>(quantized_buffer_->data());
            quantized_.d = reinterpret_cast<float*>(quantized_buffer_->data() + values);
        }
        return true;
    }
    void forget_quantized() { quantized_from_ = nullptr; }
    // A matmul wrote out: if that is where the quantized input came from, it is stale.
    void wrote(const Tensor& out) {
        const auto* from = reinterpret_cast<const uint8_t*>(quantized_from_);
        const auto* begin = dev<uint8_t>(out);
        if (from != nullptr && begin < from + quantized_count_ * sizeof(float) &&
            from < begin + out.bytes())
            forget_quantized();
    }
    // The kernels read x in 16-byte vectors: every activation tensor starts a row of a
    // buffer, so this holds for the model's inputs.
    static bool aligned(const Tensor& x, const Tensor& w) {
        return reinterpret_cast<uintptr_t>(dev(x)) % 16 == 0 && w.cols % 32 == 0;
    }
    static Status unaligned() {
        return Unsupported("CUDA matmul needs 16-byte aligned inputs of whole blocks");
    }
    // Wider than a verification forward (which must be batch invariant): in tiles.
    bool in_tiles(int64_t columns) const { return tiled_ && columns > kVerificationColumns; }
    static Status no_kernel(GgmlType type) {
        return Unsupported(std::string("the CUDA backend has no kernel for ") +
                           ggml_type_name(type) + " weights");
    }

    Status usable() const {
        if (lost_) return {SPECULA_ERR_DEVICE_LOST, "the CUDA device was lost"};
        return Status::Ok();
    }
    void fail(Status s) {
        if (pending_.ok())
            std::swap(pending_, s);  // (nvcc flags an assignment of a [[nodiscard]] type)
    }
    void check(cudaError_t e, const char* what) {
        if (e != cudaSuccess) fail(cuda_status(e, what));
    }

    specula_device_info info_{};
    int device_ = 0;
    cudaStream_t stream_ = nullptr;
    std::array<cudaEvent_t, kTimeSlots> events_{};
    std::unique_ptr<CudaBuffer> scratch_;
    std::unique_ptr<CudaBuffer> attention_partial_;  // split-K attention's chunk states
    int multiprocessors_ = 1;
    // The options (init() sets these). split_attention off keeps every row's chunks in one
    // block (the same results; what split-K is measured against).
    bool split_attention_ = true;
    // tiled off multiplies wide batches in slices of 16 columns too (what the tiled kernel is
    // measured against).
    bool tiled_ = true;
    // host_rules runs the mask programs (Whisper's rules) on the host (the base class's read, mask
    // and write: what the kernel is measured against).
    bool host_rules_ = false;
    // fused_gate / fused_rope off: the feed-forward's gate and up products and gated_mul, and the
    // q and k products and their rotation, as separate kernels (the same floats; what the fused
    // kernels are measured against).
    bool fused_gate_ = true;
    bool fused_rope_ = true;
    // staged off: each thread reads its weights from memory itself instead of a warp reading
    // them into shared memory in 16-byte loads (the same floats; what the staged reads are
    // measured against). tensor_cores on: Q8_0 and Q4_0 times 8-bit inputs by mma.sync
    // (matmul_mma_kernel, sm_80 and later; other floats, batch invariant too) rather than by
    // dp4a in matmul_kernel: faster for wide verification batches, slower for one column
    // (docs/DESIGN.md).
    cuda::MatmulReads reads_{.staged = true, .tensor_cores = false};
    // Q8_0 and Q4_0 weights are multiplied by inputs quantized to 8 bits per block of 32 (the
    // cpu's integer kernels' rounding), by integer dot products; int8_inputs off: by the floats
    // (what the integer products are measured against).
    bool int8_inputs_ = true;
    std::unique_ptr<CudaBuffer> quantized_buffer_;
    cuda::QuantizedInputs quantized_;
    const float* quantized_from_ = nullptr;  // what quantized_ holds, or null
    int64_t quantized_count_ = 0;
    Status pending_;
    bool lost_ = false;
    uint64_t host_waits_ = 0;
};

}  // namespace

std::vector<specula_device_info> enumerate_cuda_devices() {
    std::vector<specula_device_info> out;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the error state for later calls
        return out;
    }
    for (int i = 0; i < n; ++i) {
        cudaDeviceProp p{};
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        specula_device_info d{};
        d.kind = SPECULA_BACKEND_CUDA;
        d.index = i;
        std::snprintf(d.name, sizeof d.name, "%s", p.name);
        d.memory_bytes = p.totalGlobalMem;
        d.is_discrete_gpu = !p.integrated;
        out.push_back(d);
    }
    return out;
}

Status create_cuda_backend(const specula_backend_params& params, std::unique_ptr<Backend>* out) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cuda_status(e, "no usable CUDA device");
    }
    const auto devices = enumerate_cuda_devices();
    if (devices.empty()) return {SPECULA_ERR_NO_DEVICE, "no CUDA device was found"};
    size_t chosen = 0;
    SPECULA_TRY(choose_device(devices, params, "CUDA", &chosen));
    auto backend = std::make_unique<CudaBackend>();
    SPECULA_TRY(backend->init(devices[chosen].index, devices[chosen],
                              resolve_options(SPECULA_BACKEND_CUDA, params.options)));
    *out = std::move(backend);
    return Status::Ok();
}

}  // namespace specula
