// The reference backend: plain C++ that every other backend is tested against.
// Each op runs when it is recorded. Row results are computed by one function
// whatever the batch size, in a fixed reduction order, so they are batch invariant.
#include "backend/cpu/cpu_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/aligned.h"
#include "core/fp16.h"
#include "core/log.h"
#include "format/quant.h"
#include "sampling/verify.h"

namespace specula {

namespace {

// Rows of one head an attention job takes where every row sees the same keys: enough that a
// key or value, read once, serves several queries, few enough that 1500 rows of a few heads
// still make jobs for every thread.
constexpr int64_t kAttentionRowBlock = 8;

// Zero-filled host memory that starts on a cache line. Large blocks come straight from mmap,
// whose pages the kernel zero-fills as they are first touched: a buffer is paid for where it is
// used, not when it is made (a speculative step's rows of draft logits, which greedy decoding
// never writes, took ~1 ms of page faults per transcription filled up front).
class ZeroedPages {
  public:
    ZeroedPages() = default;
    ZeroedPages(ZeroedPages&& o) noexcept
        : small_(std::move(o.small_)),
          mapped_(std::exchange(o.mapped_, nullptr)),
          bytes_(o.bytes_),
          data_(std::exchange(o.data_, nullptr)) {}
    ZeroedPages& operator=(ZeroedPages&& o) noexcept {
        std::swap(small_, o.small_);
        std::swap(mapped_, o.mapped_);
        std::swap(bytes_, o.bytes_);
        std::swap(data_, o.data_);
        return *this;
    }
    ZeroedPages(const ZeroedPages&) = delete;
    ~ZeroedPages() {
        if (mapped_ != nullptr) munmap(mapped_, bytes_);
    }
    // A null data() when the memory cannot be had. `huge`: memory a kernel streams through
    // (repacked weights) starts on a 2 MiB boundary and asks the kernel for huge pages, where
    // it grants them (transparent huge pages "madvise" or "always").
    static ZeroedPages allocate(size_t bytes, bool huge = false) {
        ZeroedPages z;
        if (bytes < kMapFrom) {
            z.bytes_ = bytes;
            z.small_ = allocate_aligned<uint8_t>(bytes, true);
            z.data_ = z.small_.get();
            return z;
        }
        huge = huge && bytes >= kHugePage;
        z.bytes_ = bytes + (huge ? kHugePage : 0);
        void* p =
            mmap(nullptr, z.bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return z;
        z.mapped_ = p;
        auto start = reinterpret_cast<uintptr_t>(p);
        if (huge) {
            start = (start + kHugePage - 1) & ~uintptr_t(kHugePage - 1);
            madvise(reinterpret_cast<void*>(start), bytes, MADV_HUGEPAGE);  // advice only
        }
        z.data_ = reinterpret_cast<uint8_t*>(start);
        return z;
    }
    uint8_t* data() const { return data_; }

  private:
    // AddressSanitizer checks heap blocks, not mappings: its builds keep every buffer checked.
#ifdef SPECULA_ADDRESS_SANITIZER
    static constexpr size_t kMapFrom = SIZE_MAX;
#else
    static constexpr size_t kMapFrom = size_t(1) << 20;
#endif
    static constexpr size_t kHugePage = size_t(2) << 20;
    AlignedArray<uint8_t> small_;
    void* mapped_ = nullptr;
    size_t bytes_ = 0;  // of the mapping
    uint8_t* data_ = nullptr;
};

class CpuBuffer final : public Buffer {
  public:
    // Zero-filled; check allocated() (a nothrow allocation: an exception, or a sanitizer
    // abort on a failed operator new, must not stand in for an out-of-memory status).
    explicit CpuBuffer(size_t bytes) : owned_(ZeroedPages::allocate(bytes)), size_(bytes) {
        data_ = owned_.data();
    }
    explicit CpuBuffer(std::span<const uint8_t> borrowed)
        : data_(const_cast<uint8_t*>(borrowed.data())),
          size_(borrowed.size()),
          read_only_(true),
          borrowed_(true) {}
    // Weights that only the integer kernels read (WeightUse::kMatmul): no bytes in the file's
    // layout, only those of allocate_packed(); `bytes` is the layout's size.
    static std::unique_ptr<CpuBuffer> packed_only(size_t bytes) {
        return std::unique_ptr<CpuBuffer>(new CpuBuffer(bytes, PackedOnly{}));
    }

    size_t size() const override { return size_; }
    bool reads_host() const override { return borrowed_; }
    bool allocated() const { return data_ != nullptr || size_ == 0; }
    // nullptr for packed_only() weights.
    uint8_t* data() const { return data_; }
    bool read_only() const { return read_only_; }
    // The weights repacked for the integer kernels (cpu::pack_rows), or nullptr.
    const uint8_t* packed() const { return packed_.data(); }
    // Room for them, or nullptr when the memory cannot be had.
    uint8_t* allocate_packed(size_t bytes) {
        packed_ = ZeroedPages::allocate(bytes, true);
        return packed_.data();
    }

    // A copy of a key or value cache held in this buffer in the layout attention reads: the
    // keys' transpose (cpu::transpose_keys), in floats or, for values exact in F16, in halves;
    // or such values as halves (cpu::values_to_halves). Its first `valid` rows are the cache's:
    // every op that writes into the buffer lowers that count to the first row it wrote
    // (wrote()).
    enum class CopyKind { kKeysTransposed, kKeysTransposedHalves, kValuesHalves };
    struct CacheCopy {
        CopyKind kind = CopyKind::kKeysTransposed;
        size_t offset = 0;  // the cache tensor: its bytes at offset, rows of `cols` floats
        int64_t cols = 0, rows = 0;
        int head_dim = 0;
        int64_t valid = 0;
        // Huge pages where the kernel grants them: a context's first decoder forward writes
        // the transposes of every layer's cross-attention keys for the first time (0.25 GB
        // in floats for Whisper large), 1.5 s in 4 KiB pages on a 2-vCPU machine, 0.7 s in
        // huge pages.
        ZeroedPages pages;
        float* floats() const { return reinterpret_cast<float*>(pages.data()); }
        uint16_t* halves() const { return reinterpret_cast<uint16_t*>(pages.data()); }
    };
    // The copy of cache `t` (created empty, or nullptr when the memory cannot be had).
    CacheCopy* cache_copy(const Tensor& t, int head_dim, CopyKind kind) {
        for (auto& c : copies_)
            if (c->offset == t.offset && c->cols == t.cols && c->rows == t.rows &&
                c->head_dim == head_dim && c->kind == kind)
                return c.get();
        const auto values =
            kind == CopyKind::kValuesHalves
                ? size_t(t.cols * t.rows)
                : size_t(cpu::transposed_key_floats(int(t.cols / head_dim), head_dim, t.rows));
        auto c = std::make_unique<CacheCopy>();
        c->pages = ZeroedPages::allocate(
            values * (kind == CopyKind::kKeysTransposed ? sizeof(float) : sizeof(uint16_t)), true);
        if (c->pages.data() == nullptr) return nullptr;
        c->kind = kind;
        c->offset = t.offset;
        c->cols = t.cols;
        c->rows = t.rows;
        c->head_dim = head_dim;
        copies_.push_back(std::move(c));
        return copies_.back().get();
    }
    // Bytes [offset, offset + bytes) of this buffer were written.
    void wrote(size_t offset, size_t bytes) {
        for (auto& t : copies_) {
            const size_t row_bytes = size_t(t->cols) * sizeof(float);
            const size_t end = t->offset + size_t(t->rows) * row_bytes;
            if (offset >= end || offset + bytes <= t->offset) continue;
            const auto first = int64_t(offset > t->offset ? (offset - t->offset) / row_bytes : 0);
            t->valid = std::min(t->valid, first);
        }
    }
    bool has_cache_copies() const { return !copies_.empty(); }

  private:
    ZeroedPages owned_;
    struct PackedOnly {};
    CpuBuffer(size_t bytes, PackedOnly) : size_(bytes), read_only_(true) {}
    ZeroedPages packed_;
    std::vector<std::unique_ptr<CacheCopy>> copies_;
    uint8_t* data_ = nullptr;
    size_t size_ = 0;
    bool read_only_ = false;
    bool borrowed_ = false;  // data_ is the host memory the buffer was made from
};

// What an op that reads weights kept only repacked (CpuBuffer::packed_only()) otherwise than
// as a whole matrix's products says.
constexpr const char* kNoBytes =
    "weights loaded for whole-matrix products only (WeightUse::kMatmul) were read otherwise";

// nullptr for weights kept only repacked.
uint8_t* bytes_of(const Tensor& t) {
    uint8_t* data = static_cast<CpuBuffer*>(t.buffer)->data();
    return data != nullptr ? data + t.offset : nullptr;
}
float* f32(const Tensor& t) {
    return reinterpret_cast<float*>(bytes_of(t));
}
const float* row_f32(const Tensor& t, int64_t r) {
    return f32(t) + r * t.cols;
}

// The profile option: the host time of each op (by name), printed when the backend is
// destroyed, as Vulkan's profile does for shaders.
class OpProfile {
  public:
    explicit OpProfile(bool on) : on_(on) {}
    ~OpProfile() {
        if (!on_ || ops_.empty()) return;
        std::vector<std::pair<std::string_view, Entry>> rows(ops_.begin(), ops_.end());
        std::sort(rows.begin(), rows.end(),
                  [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
        double total = 0;
        for (const auto& [name, e] : rows)
            total += e.seconds;
        std::fprintf(stderr, "specula cpu profile: %.3f ms in ops\n", total * 1e3);
        for (const auto& [name, e] : rows)
            std::fprintf(stderr, "  %-14.*s %9llu calls %10.3f ms %6.1f%% %8.2f us/call\n",
                         int(name.size()), name.data(), static_cast<unsigned long long>(e.calls),
                         e.seconds * 1e3, 100.0 * e.seconds / total,
                         1e6 * e.seconds / double(e.calls));
    }
    // Times the scope it lives in under `name` (a string literal), when profiling is on.
    class Scope {
      public:
        Scope(OpProfile& p, std::string_view name) : p_(p.on_ ? &p : nullptr), name_(name) {
            if (p_) t0_ = std::chrono::steady_clock::now();
        }
        ~Scope() {
            if (!p_) return;
            Entry& e = p_->ops_[name_];
            ++e.calls;
            e.seconds +=
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
        }
        Scope(const Scope&) = delete;
        Scope& operator=(const Scope&) = delete;

      private:
        OpProfile* p_;
        std::string_view name_;
        std::chrono::steady_clock::time_point t0_;
    };

  private:
    struct Entry {
        uint64_t calls = 0;
        double seconds = 0;
    };
    bool on_;
    std::map<std::string_view, Entry> ops_;
};

class CpuBackend final : public Backend {
  public:
    CpuBackend(int n_threads, const specula_backend_options& options)
        : profile_(options.profile),
          pool_(n_threads),
          int8_inputs_(path_on(options.int8_inputs, true)),
          amx_(path_on(options.amx, true) && cpu::amx_available()) {
        info_.kind = SPECULA_BACKEND_CPU;
        info_.index = 0;
        std::snprintf(info_.name, sizeof info_.name, "cpu (%d threads, %s%s)", pool_.size(),
                      cpu::simd_target(), amx_ ? ", AMX" : "");
    }

    const specula_device_info& info() const override { return info_; }
    bool supports(Op op, GgmlType type) const override {
        switch (op) {
            case Op::kNormedMatmul:  // the norm is computed on its own: the matmuls read it once
                return false;
            case Op::kMaskLogits:  // in place, in the host's memory
                return true;
            default:  // matmul_gated and matmul_rope are one loop over rows each
                return is_runnable_weight_type(type);
        }
    }
    bool quantizes_inputs(GgmlType type, int64_t /*columns*/) const override {
        return int8_inputs_ && cpu::has_integer_kernel(type);
    }

    void parallel_for_host(size_t n, const std::function<void(size_t, size_t)>& fn) override {
        pool_.parallel_for(n, fn);
    }

    // Linux's MemAvailable (what can be allocated without swapping), else the free pages.
    uint64_t available_memory() const override {
        if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
            char line[256];
            unsigned long long kib = 0;
            bool found = false;
            while (!found && std::fgets(line, sizeof line, f))
                found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
            std::fclose(f);
            if (found) return uint64_t(kib) * 1024;
        }
        const long pages = sysconf(_SC_AVPHYS_PAGES), page_bytes = sysconf(_SC_PAGE_SIZE);
        return pages > 0 && page_bytes > 0 ? uint64_t(pages) * uint64_t(page_bytes) : 0;
    }

    Status allocate(size_t bytes, std::unique_ptr<Buffer>* out) override {
        quantized_from_ = {};
        // Where the kernel overcommits memory, an allocation larger than the machine succeeds
        // and zero-filling it gets the process killed: refuse it here instead.
        const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGE_SIZE);
        if (pages > 0 && page_bytes > 0 && bytes / size_t(page_bytes) > size_t(pages))
            return OutOfMemory(
                "cannot allocate " + std::to_string(bytes) + " bytes: more than this machine's " +
                std::to_string(size_t(pages) * size_t(page_bytes)) + " bytes of memory");
        auto buffer = std::make_unique<CpuBuffer>(bytes);
        if (!buffer->allocated())
            return OutOfMemory("cannot allocate " + std::to_string(bytes) +
                               " bytes of host memory");
        *out = std::move(buffer);
        return Status::Ok();
    }

    Status load_weights(std::span<const uint8_t> host, GgmlType type, int64_t cols, int64_t rows,
                        WeightUse use, std::unique_ptr<Buffer>* out) override {
        const bool packs = int8_inputs_ && cpu::has_integer_kernel(type);
        const bool aligned = reinterpret_cast<uintptr_t>(host.data()) % alignof(uint64_t) == 0;
        std::unique_ptr<CpuBuffer> buffer;
        if (packs && use == WeightUse::kMatmul) {
            // Only the repacked copy: no op reads the file's layout, so the model may give
            // the host's pages back (a whisper.cpp file's copy cost as much memory again).
            buffer = CpuBuffer::packed_only(host.size());
        } else if (aligned) {
            buffer = std::make_unique<CpuBuffer>(host);  // in place
        } else {
            // whisper.cpp's files do not pad their tensor records, and the kernels load floats
            // and scales directly: a copy.
            buffer = std::make_unique<CpuBuffer>(host.size());
            if (!buffer->allocated())
                return OutOfMemory("cannot allocate " + std::to_string(host.size()) +
                                   " bytes for a copy of unaligned weights");
            std::memcpy(buffer->data(), host.data(), host.size());
            host = {buffer->data(), host.size()};
        }
        if (packs) {
            const size_t bytes = cpu::packed_bytes(type, rows, cols);
            uint8_t* packed = buffer->allocate_packed(bytes);
            if (packed == nullptr)
                return OutOfMemory("cannot allocate " + std::to_string(bytes) +
                                   " bytes for repacked weights");
            const size_t row_bytes = Tensor{nullptr, 0, type, cols, rows}.row_bytes();
            const size_t group_bytes = cpu::packed_bytes(type, cpu::kGroupRows, cols);
            // An unaligned host was copied above unless only the repacked form is kept.
            const bool in_place = aligned || use != WeightUse::kMatmul;
            pool_.parallel_for(bytes / group_bytes, [&](size_t begin, size_t end) {
                if (in_place)
                    return cpu::pack_rows(type, host.data(), row_bytes, rows, cols, int64_t(begin),
                                          int64_t(end), packed + begin * group_bytes);
                // Unaligned rows are read as blocks from an aligned copy of their group.
                std::vector<uint64_t> group(
                    (size_t(cpu::kGroupRows) * row_bytes + sizeof(uint64_t) - 1) /
                    sizeof(uint64_t));
                for (size_t g = begin; g < end; ++g) {
                    const int64_t first = int64_t(g) * cpu::kGroupRows;
                    const int64_t n = std::min(cpu::kGroupRows, rows - first);
                    std::memcpy(group.data(), host.data() + size_t(first) * row_bytes,
                                size_t(n) * row_bytes);
                    cpu::pack_rows(type, reinterpret_cast<const uint8_t*>(group.data()), row_bytes,
                                   n, cols, 0, 1, packed + g * group_bytes);
                }
            });
        }
        *out = std::move(buffer);
        return Status::Ok();
    }

    void upload(const Tensor& dst, const void* src) override {
        if (dst.offset + dst.bytes() > dst.buffer->size())
            return fail(InvalidArgument("an upload reaches past the end of its buffer"));
        wrote(dst);
        std::memcpy(bytes_of(dst), src, dst.bytes());
    }

    Status download(const Tensor& src, void* dst) override {
        if (src.offset + src.bytes() > src.buffer->size())
            return InvalidArgument("a download reaches past the end of its buffer");
        if (bytes_of(src) == nullptr) return InvalidArgument(kNoBytes);
        SPECULA_TRY(flush());
        std::memcpy(dst, bytes_of(src), src.bytes());
        return Status::Ok();
    }

    Status flush() override {
        ++host_waits_;
        Status s = std::move(pending_);
        pending_ = Status::Ok();
        return s;
    }

    uint64_t host_waits() const override { return host_waits_; }

    void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out) override {
        const OpProfile::Scope timed(profile_, "get_rows");
        wrote(out);
        const auto* id = reinterpret_cast<const int32_t*>(bytes_of(ids));
        if (bytes_of(table) == nullptr) return fail(InvalidArgument(kNoBytes));
        for (int64_t i = 0; i < ids.cols * ids.rows; ++i) {
            if (id[i] < 0 || id[i] >= table.rows) {
                fail(InvalidArgument("token id " + std::to_string(id[i]) +
                                     " is outside the vocabulary"));
                return;
            }
            cpu::decode_row(table.type, bytes_of(table) + size_t(id[i]) * table.row_bytes(),
                            table.cols, f32(out) + i * out.cols);
        }
    }

    void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) override {
        const OpProfile::Scope timed(profile_, "rms_norm");
        wrote(out);
        const float* w = f32(weight);
        parallel_for(size_t(x.rows), size_t(x.cols) * 2, [&](size_t begin, size_t end) {
            for (auto r = int64_t(begin); r < int64_t(end); ++r) {
                const float* xr = row_f32(x, r);
                const float mean = cpu::dot_f32(xr, xr, x.cols) / float(x.cols);
                const float scale = 1.0f / std::sqrt(mean + eps);
                float* o = f32(out) + r * out.cols;
                for (int64_t i = 0; i < x.cols; ++i)
                    o[i] = xr[i] * scale * w[i];
            }
        });
    }

    void matmul(const Tensor& w, const MatmulInput& input, const Tensor& out,
                Accumulate accumulate) override {
        const OpProfile::Scope timed(profile_, "matmul");
        wrote(out);
        const Tensor x = apply_norm(input);
        const cpu::MatmulArgs args = matmul_args(w, x, out, accumulate, quantized(x, w.type));
        if (!weights_readable(args)) return;
        parallel_for_rows(w, x, 1,
                          [&](int64_t begin, int64_t end) { cpu::matmul_rows(args, begin, end); });
    }

    void rope(const Tensor& x, const Tensor& positions, const Tensor& table, int head_dim,
              int n_rot) override {
        const OpProfile::Scope timed(profile_, "rope");
        wrote(x);
        const Rope r{positions, table, head_dim, n_rot};
        parallel_for(size_t(x.rows), size_t(x.cols), [&](size_t begin, size_t end) {
            for (auto i = int64_t(begin); i < int64_t(end); ++i)
                rotate(x, i, r, 0, x.cols);
        });
    }

    // matmul and then rope: each thread rotates the features it has just computed (threads
    // take whole tiles of 4 rows, so a pair (2j, 2j + 1) is never split), by rotate() as
    // rope() does: the same floats.
    void matmul_rope(const Tensor& w, const MatmulInput& input, const Tensor& out,
                     const Rope& rope) override {
        const OpProfile::Scope timed(profile_, "matmul_rope");
        wrote(out);
        static_assert(cpu::kRowTile % 2 == 0);
        const Tensor x = apply_norm(input);
        const cpu::MatmulArgs args = matmul_args(w, x, out, Accumulate::kNo, quantized(x, w.type));
        if (!weights_readable(args)) return;
        parallel_for_rows(w, x, 1, [&](int64_t begin, int64_t end) {
            cpu::matmul_rows(args, begin, end);
            for (int64_t i = 0; i < x.rows; ++i)
                rotate(out, i, rope, begin, end);
        });
    }

    void copy(const Tensor& src, const Tensor& dst) override {
        const OpProfile::Scope timed(profile_, "copy");
        wrote(dst);
        std::memcpy(bytes_of(dst), bytes_of(src), size_t(src.cols * src.rows) * sizeof(float));
    }

    void attention(const Attention& a) override {
        const OpProfile::Scope timed(profile_, "attention");
        wrote(a.out);
        if (transposed_attention(a)) return;
        // Without memory for the transpose: a job is a query row and a key/value head, with the
        // query heads that share it; where every row sees the same keys (the encoder,
        // cross-attention) and heads are not shared, a block of rows of one head, so that each
        // key and value is read once for the block.
        const int group = a.n_head / a.n_head_kv;
        const bool blocks = a.n_keys > 0 && group == 1;
        const int64_t rows_per_job = blocks ? kAttentionRowBlock : 1;
        const int64_t row_jobs = (a.q.rows + rows_per_job - 1) / rows_per_job;
        parallel_for(
            size_t(row_jobs) * size_t(a.n_head_kv),
            size_t(a.head_dim) * size_t(a.keys_seen(a.q.rows - 1)) * 2 * size_t(group) *
                size_t(rows_per_job),
            [&](size_t begin, size_t end) {
                thread_local AlignedVector<float> scores, queries, outs;
                for (size_t job = begin; job < end; ++job) {
                    const int64_t i = int64_t(job / size_t(a.n_head_kv)) * rows_per_job;
                    const int kv_head = int(job % size_t(a.n_head_kv));
                    // A sliding window's keys from its first on (blocks see every key).
                    const int key0 = a.first_key(i);
                    const int n_keys = a.keys_seen(i) - key0;
                    const int64_t head = int64_t(kv_head) * a.head_dim;
                    const float* k = f32(a.k) + key0 * a.k.cols + head;
                    const float* v = f32(a.v) + key0 * a.v.cols + head;
                    if (!blocks) {
                        scores.resize(size_t(group) * size_t(n_keys));
                        const int64_t first = head * group;
                        cpu::attend(row_f32(a.q, i) + first, group, k, a.k.cols, v, a.v.cols,
                                    n_keys, a.head_dim, a.scale, a.soft_cap, scores.data(),
                                    f32(a.out) + i * a.out.cols + first);
                        continue;
                    }
                    // The block's queries side by side, as attend() takes them, and back.
                    const int rows = int(std::min(rows_per_job, a.q.rows - i));
                    const auto dim = size_t(a.head_dim);
                    scores.resize(size_t(rows) * size_t(n_keys));
                    queries.resize(size_t(rows) * dim);
                    outs.resize(size_t(rows) * dim);
                    for (int r = 0; r < rows; ++r)
                        std::copy_n(row_f32(a.q, i + r) + head, dim, &queries[size_t(r) * dim]);
                    cpu::attend(queries.data(), rows, k, a.k.cols, v, a.v.cols, n_keys, a.head_dim,
                                a.scale, a.soft_cap, scores.data(), outs.data());
                    for (int r = 0; r < rows; ++r)
                        std::copy_n(&outs[size_t(r) * dim], dim,
                                    f32(a.out) + (i + r) * a.out.cols + head);
                }
            },
            /*uneven=*/a.n_keys == 0);
    }

    void gated_mul(Activation act, const Tensor& gate, const Tensor& up,
                   const Tensor& out) override {
        const OpProfile::Scope timed(profile_, "gated_mul");
        wrote(out);
        cpu::gated_times(uint32_t(act), f32(gate), f32(up), f32(out), gate.cols * gate.rows);
    }

    void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                    const Tensor& out) override {
        const OpProfile::Scope timed(profile_, "layer_norm");
        wrote(out);
        const float *w = f32(weight), *b = f32(bias);
        parallel_for(size_t(x.rows), size_t(x.cols) * 3, [&](size_t begin, size_t end) {
            for (auto r = int64_t(begin); r < int64_t(end); ++r) {
                const float* xr = row_f32(x, r);
                float sum = 0.0f;
                for (int64_t i = 0; i < x.cols; ++i)
                    sum += xr[i];
                const float mean = sum / float(x.cols);
                float squares = 0.0f;
                for (int64_t i = 0; i < x.cols; ++i)
                    squares += (xr[i] - mean) * (xr[i] - mean);
                const float scale = 1.0f / std::sqrt(squares / float(x.cols) + eps);
                float* o = f32(out) + r * out.cols;
                for (int64_t i = 0; i < x.cols; ++i)
                    o[i] = (xr[i] - mean) * scale * w[i] + b[i];
            }
        });
    }

    void activate(Activation act, const Tensor& x, const Tensor& out) override {
        const OpProfile::Scope timed(profile_, "activate");
        wrote(out);
        const float* in = f32(x);
        float* o = f32(out);
        const int64_t n = x.cols * x.rows;
        parallel_for(size_t(n), 8, [&](size_t begin, size_t end) {
            cpu::activate(uint32_t(act), in + begin, o + begin, int64_t(end - begin));
        });
    }

    void scale(const Tensor& x, float factor) override {
        const OpProfile::Scope timed(profile_, "scale");
        wrote(x);
        float* p = f32(x);
        for (int64_t i = 0; i < x.cols * x.rows; ++i)
            p[i] *= factor;
    }

    void round_to_half(const Tensor& x) override {
        const OpProfile::Scope timed(profile_, "round_to_half");
        wrote(x);
        cpu::round_to_half(f32(x), x.cols * x.rows);
    }

    void soft_cap(const Tensor& x, float cap) override {
        const OpProfile::Scope timed(profile_, "soft_cap");
        wrote(x);
        cpu::soft_cap(f32(x), x.cols * x.rows, cap);
    }

    void add_bias(const Tensor& x, const Tensor& bias) override {
        const OpProfile::Scope timed(profile_, "add_bias");
        wrote(x);
        const bool per_row = bias.rows > 1;
        for (int64_t r = 0; r < x.rows; ++r) {
            float* xr = f32(x) + r * x.cols;
            const float* b = f32(bias) + (per_row ? r * x.cols : 0);
            for (int64_t i = 0; i < x.cols; ++i)
                xr[i] += b[i];
        }
    }

    void expand_columns(const Tensor& src, const Tensor& ids, float fill,
                        const Tensor& out) override {
        const OpProfile::Scope timed(profile_, "expand_columns");
        wrote(out);
        const auto* id = reinterpret_cast<const int32_t*>(bytes_of(ids));
        for (int64_t r = 0; r < out.rows; ++r) {
            const float* s = f32(src) + r * src.cols;
            float* o = f32(out) + r * out.cols;
            // One fill of the row, then the kept columns: the gaps between kept ids are short
            // (a few floats each), and one fill each measured 3x slower.
            std::fill(o, o + out.cols, fill);
            for (int64_t j = 0; j < ids.cols; ++j)
                o[id[j]] = s[j];
        }
    }

    void im2col(const Tensor& x, const Convolution& conv, const Tensor& out) override {
        const OpProfile::Scope timed(profile_, "im2col");
        wrote(out);
        const int64_t C = x.cols, K = conv.kernel;
        parallel_for(size_t(out.rows), size_t(out.cols), [&](size_t begin, size_t end) {
            for (auto t = int64_t(begin); t < int64_t(end); ++t) {
                float* o = f32(out) + t * out.cols;
                std::fill(o, o + out.cols, 0.0f);
                for (int64_t k = 0; k < K; ++k) {
                    const int64_t src = conv.stride * t + k - conv.padding;
                    if (src < 0 || src >= x.rows) continue;
                    const float* xr = row_f32(x, src);
                    for (int64_t c = 0; c < C; ++c)
                        o[K * c + k] = xr[c];
                }
            }
        });
    }

    // matmul(w_gate), matmul(w_up) and gated_mul in one loop over rows: the same floats, one
    // wake-up of the workers, and the element-wise part spread over them.
    void matmul_gated(Activation act, const Tensor& w_gate, const Tensor& w_up,
                      const MatmulInput& input, const Tensor& out, const Tensor& up) override {
        const OpProfile::Scope timed(profile_, "matmul_gated");
        wrote(out);
        wrote(up);
        const Tensor x = apply_norm(input);
        const cpu::QuantizedInputs* qx = quantized(x, w_gate.type);
        if (qx == nullptr) qx = quantized(x, w_up.type);
        const cpu::MatmulArgs gate_args = matmul_args(w_gate, x, out, Accumulate::kNo, qx);
        const cpu::MatmulArgs up_args = matmul_args(w_up, x, up, Accumulate::kNo, qx);
        if (!weights_readable(gate_args) || !weights_readable(up_args)) return;
        parallel_for_rows(w_gate, x, 2, [&](int64_t begin, int64_t end) {
            cpu::matmul_rows(gate_args, begin, end);
            cpu::matmul_rows(up_args, begin, end);
            for (int64_t i = 0; i < x.rows; ++i) {
                float* g = f32(out) + i * out.cols + begin;
                cpu::gated_times(uint32_t(act), g, f32(up) + i * up.cols + begin, g, end - begin);
            }
        });
    }

    // Ops run as they are recorded, so the host clock is the device clock.
    void mark_time(int slot) override { marks_[size_t(slot)] = std::chrono::steady_clock::now(); }
    double seconds_between(int from, int to) const override {
        return std::chrono::duration<double>(marks_[size_t(to)] - marks_[size_t(from)]).count();
    }

    void verify(const VerifyArgs& a) override {
        const OpProfile::Scope timed(profile_, "verify");
        if (a.result.buffer != nullptr) wrote(a.result);
        if (a.token.buffer != nullptr) wrote(a.token);
        const auto V = size_t(a.target.cols);
        const auto g = size_t(a.gamma);
        const auto* ids = reinterpret_cast<const int32_t*>(g > 0 ? bytes_of(a.drafts) : nullptr);
        for (size_t b = 0; b < size_t(a.batch); ++b) {
            const std::span<const float> target(f32(a.target) + b * (g + 1) * V, (g + 1) * V);
            std::span<const float> draft;
            if (g > 0 && !a.sampling.greedy()) draft = {f32(a.draft) + b * g * V, g * V};
            const std::span<const int32_t> drafts(ids ? ids + b * g : nullptr, g);
            const VerifyResult r =
                specula::verify(target, draft, drafts, int(V), a.sampling, a.step, a.stream,
                                a.row_offset + uint32_t(b) * kVerifyRowsPerSequence);
            if (a.result.buffer != nullptr) {
                auto* out = reinterpret_cast<int32_t*>(bytes_of(a.result)) + b * (g + 2);
                out[0] = r.n_accepted;
                std::copy_n(drafts.begin(), r.n_accepted, out + 1);
                out[1 + r.n_accepted] = r.token;
            }
            if (a.token.buffer != nullptr)
                reinterpret_cast<int32_t*>(bytes_of(a.token))[b] = r.token;
        }
    }

    void mask_logits(const MaskArgs& a) override {
        const OpProfile::Scope timed(profile_, "mask_logits");
        wrote(a.logits);
        if (a.log_sum_exp.buffer != nullptr) wrote(a.log_sum_exp);
        const auto V = size_t(a.logits.cols), rows = size_t(a.logits.rows);
        const size_t n_drafts = size_t(a.first_row) + rows - 1;
        const std::span<const int32_t> drafts(
            n_drafts > 0 ? reinterpret_cast<const int32_t*>(bytes_of(a.drafts)) : nullptr,
            n_drafts);
        std::span<float> lse;
        if (a.log_sum_exp.buffer != nullptr) lse = {f32(a.log_sum_exp), rows};
        apply_mask_program_to_step(a.program, a.state, drafts, a.first_row,
                                   {f32(a.logits), rows * V}, int(V), lse);
    }

  private:
    // Bytes of t's buffer were written: a key cache's transpose forgets the keys from there on.
    // Also forgets quantized inputs read from there.
    void wrote(const Tensor& t) {
        auto* b = static_cast<CpuBuffer*>(t.buffer);
        if (b == nullptr) return;
        if (b->has_cache_copies()) b->wrote(t.offset, t.bytes());
        if (b == quantized_from_.buffer &&
            t.offset < quantized_from_.offset + quantized_from_.bytes &&
            quantized_from_.offset < t.offset + t.bytes())
            quantized_from_ = {};
    }

    // Attention over the keys' transpose, which is brought up to the keys the last row sees
    // first (the rows written since it was last read: a causal forward's own; an encoder
    // layer's keys each time; a decoder's cross-attention keys once per audio window, then
    // read by every token). A job is a block of query rows and a key/value head, with the
    // query heads that share it: each key and value read serves every row of the block (a
    // verification batch is one block), each row seeing its own keys. Jobs go head by head: a
    // thread's next job reads the same head's keys and values (768 KiB at Whisper large's 1500
    // keys) from its L2 rather than every head's of the layer (15 MiB) in turn from L3 or
    // memory, as an encoder window's 188 blocks of rows would. No sum across lanes per
    // score: 1.6-2.4x faster than attend() over rows of keys (Whisper's 250 or 1500 keys,
    // head_dim 64). Keys and values exact in F16 (Attention::half_exact) are read from copies
    // in halves: the same floats at half the bytes (a decoder token reads Whisper large's
    // cross-attention keys and values, 0.49 GB in floats). False when the transpose cannot be
    // had (no memory): attention() then reads the keys themselves.
    bool transposed_attention(const Attention& a) {
        using Kind = CpuBuffer::CopyKind;
        auto* k_buffer = static_cast<CpuBuffer*>(a.k.buffer);
        auto* v_buffer = static_cast<CpuBuffer*>(a.v.buffer);
        CpuBuffer::CacheCopy *kt = nullptr, *vh = nullptr;
        if (a.half_exact) {
            kt = k_buffer->cache_copy(a.k, a.head_dim, Kind::kKeysTransposedHalves);
            vh = v_buffer->cache_copy(a.v, a.head_dim, Kind::kValuesHalves);
        }
        if (kt == nullptr || vh == nullptr) {  // floats, as exact
            kt = k_buffer->cache_copy(a.k, a.head_dim, Kind::kKeysTransposed);
            vh = nullptr;
        }
        if (kt == nullptr) return false;
        const int64_t seen = a.keys_seen(a.q.rows - 1);
        // Heads apart: the copies of a window's cross-attention keys and values on every core.
        const auto bring_up = [&](CpuBuffer::CacheCopy* c, const Tensor& t) {
            if (c == nullptr || c->valid >= seen) return;
            const int64_t from = c->valid;
            const auto head_bytes = size_t(a.head_dim) * size_t(seen - from) * sizeof(float);
            parallel_for(size_t(a.n_head_kv), head_bytes, [&](size_t begin, size_t end) {
                for (auto h = int64_t(begin); h < int64_t(end); ++h) {
                    const float* src = f32(t) + h * a.head_dim;
                    if (c->kind == Kind::kValuesHalves) {
                        cpu::values_to_halves(src, t.cols, 1, a.head_dim, c->rows, from, seen,
                                              c->halves() + h * c->rows * a.head_dim);
                        continue;
                    }
                    const int64_t offset =
                        h * cpu::transposed_key_blocks(c->rows) * a.head_dim * cpu::kKeyBlock;
                    if (c->kind == Kind::kKeysTransposed)
                        cpu::transpose_keys(src, t.cols, 1, a.head_dim, c->rows, from, seen,
                                            c->floats() + offset);
                    else
                        cpu::transpose_keys(src, t.cols, 1, a.head_dim, c->rows, from, seen,
                                            c->halves() + offset);
                }
            });
            c->valid = seen;
        };
        bring_up(kt, a.k);
        bring_up(vh, a.v);
        const int group = a.n_head / a.n_head_kv;
        const int64_t head_floats =
            cpu::transposed_key_blocks(kt->rows) * a.head_dim * cpu::kKeyBlock;
        const int64_t blocks = (a.q.rows + kAttentionRowBlock - 1) / kAttentionRowBlock;
        const auto dim = size_t(a.head_dim);
        parallel_for(
            size_t(blocks) * size_t(a.n_head_kv),
            dim * size_t(seen) * 2 * size_t(group) * size_t(std::min(a.q.rows, kAttentionRowBlock)),
            [&](size_t begin, size_t end) {
                thread_local AlignedVector<float> scores, queries, outs;
                thread_local std::vector<int> firsts, keys;
                for (size_t job = begin; job < end; ++job) {
                    const int64_t i0 = int64_t(job % size_t(blocks)) * kAttentionRowBlock;
                    const int rows = int(std::min(kAttentionRowBlock, a.q.rows - i0));
                    const int kv_head = int(job / size_t(blocks));
                    const int64_t first = int64_t(kv_head) * a.head_dim * group;
                    const auto n_queries = size_t(rows) * size_t(group);
                    // The block's queries side by side, as attend_transposed() takes them.
                    queries.resize(n_queries * dim);
                    outs.resize(n_queries * dim);
                    firsts.resize(n_queries);
                    keys.resize(n_queries);
                    for (int r = 0; r < rows; ++r) {
                        std::copy_n(row_f32(a.q, i0 + r) + first, size_t(group) * dim,
                                    &queries[size_t(r) * size_t(group) * dim]);
                        std::fill_n(&firsts[size_t(r) * size_t(group)], group, a.first_key(i0 + r));
                        std::fill_n(&keys[size_t(r) * size_t(group)], group, a.keys_seen(i0 + r));
                    }
                    scores.resize(n_queries *
                                  size_t(cpu::transposed_key_blocks(a.keys_seen(i0 + rows - 1))) *
                                  size_t(cpu::kKeyBlock));
                    if (vh != nullptr)
                        cpu::attend_transposed(queries.data(), int(n_queries), firsts.data(),
                                               keys.data(), kt->halves() + kv_head * head_floats,
                                               vh->halves() + kv_head * vh->rows * a.head_dim,
                                               a.head_dim, a.head_dim, a.scale, a.soft_cap,
                                               scores.data(), outs.data());
                    else
                        cpu::attend_transposed(queries.data(), int(n_queries), firsts.data(),
                                               keys.data(), kt->floats() + kv_head * head_floats,
                                               f32(a.v) + int64_t(kv_head) * a.head_dim, a.v.cols,
                                               a.head_dim, a.scale, a.soft_cap, scores.data(),
                                               outs.data());
                    for (int r = 0; r < rows; ++r)
                        std::copy_n(&outs[size_t(r) * size_t(group) * dim], size_t(group) * dim,
                                    f32(a.out) + (i0 + r) * a.out.cols + first);
                }
            },
            /*uneven=*/true);
        return true;
    }

    // Rotates the pairs (f, f + 1) of row i of x with f even in [first, end) that lie in the
    // first n_rot dims of their head.
    static void rotate(const Tensor& x, int64_t i, const Rope& r, int64_t first, int64_t end) {
        const float* cs =
            row_f32(r.table, reinterpret_cast<const int32_t*>(bytes_of(r.positions))[i]);
        float* row = f32(x) + i * x.cols;
        for (int64_t f = first; f < end; f += 2) {
            const int64_t j = f % r.head_dim;
            if (j >= r.n_rot) continue;
            float* p = row + f;
            const float a = p[0], b = p[1], c = cs[j], s = cs[j + 1];
            p[0] = a * c - b * s;
            p[1] = a * s + b * c;
        }
    }

    // The arguments of a matmul; qx: x quantized (quantized()), for weights with integer kernels.
    cpu::MatmulArgs matmul_args(const Tensor& w, const Tensor& x, const Tensor& out,
                                Accumulate accumulate, const cpu::QuantizedInputs* qx) const {
        cpu::MatmulArgs a{w.type,   bytes_of(w), w.row_bytes(),
                          w.cols,   f32(x),      x.rows,
                          f32(out), out.cols,    accumulate == Accumulate::kYes};
        if (qx != nullptr && cpu::has_integer_kernel(w.type)) {
            a.qx = qx;
            // Packed at load time when the tensor is a whole loaded matrix; else as it is used.
            if (w.offset == 0) a.packed = static_cast<CpuBuffer*>(w.buffer)->packed();
            a.amx = amx_;
        }
        return a;
    }

    // Whether the kernels can read a matmul's weights: not those kept only repacked
    // (WeightUse::kMatmul) where the product does not read that copy (a view at an offset).
    bool weights_readable(const cpu::MatmulArgs& a) {
        if (a.w != nullptr || a.packed != nullptr) return true;
        fail(InvalidArgument(kNoBytes));
        return false;
    }

    // x quantized per block for the integer kernels where weights of `type` have them (and the
    // backend uses them), else nullptr. Valid until the next call.
    // The q, k and v projections (gate and up) read the same input: it is quantized once, and
    // kept until an op writes where it was read from (wrote()) or a buffer is allocated (one may
    // take a freed one's place).
    const cpu::QuantizedInputs* quantized(const Tensor& x, GgmlType type) {
        if (!int8_inputs_ || !cpu::has_integer_kernel(type)) return nullptr;
        if (quantized_from_.buffer == x.buffer && quantized_from_.offset == x.offset &&
            quantized_from_.rows == x.rows && quantized_from_.cols == x.cols)
            return &qx_.view();
        const OpProfile::Scope timed(profile_, "quantize");
        qx_.resize(x.rows, x.cols);
        // A block costs about as much as 128 multiply-adds (a prompt's rows are split, a
        // token's not).
        const float* xf = f32(x);
        parallel_for(size_t(x.rows * x.cols / 32), 128,
                     [&](size_t b0, size_t b1) { qx_.quantize(xf, int64_t(b0), int64_t(b1)); });
        quantized_from_ = {x.buffer, x.offset, x.bytes(), x.cols, x.rows};
        return &qx_.view();
    }

    // fn(begin, end) over the rows of w in whole tiles, for `matrices` matrices of w's shape.
    template <typename F>
    void parallel_for_rows(const Tensor& w, const Tensor& x, int matrices, F&& fn) {
        const int64_t tiles = (w.rows + cpu::kRowTile - 1) / cpu::kRowTile;
        parallel_for(size_t(tiles), size_t(w.cols * x.rows * cpu::kRowTile * matrices),
                     [&](size_t begin, size_t end) {
                         fn(int64_t(begin) * cpu::kRowTile,
                            std::min(w.rows, int64_t(end) * cpu::kRowTile));
                     });
    }

    // Waking the workers and waiting for them costs about a microsecond, and the results
    // they wrote then move to the calling thread's cache: ops of fewer than kMinWorkToSplit
    // multiply-adds (or as many elements) run on the calling thread: a 256 x 256 matrix at
    // n = 1 does, a 768 x 768 one does not. On two cores 2^17 decoded the demo target ~20%
    // faster than 2^14 and 2^16, with 85M models as fast. Every item is computed by the same
    // code either way, so results do not depend on the split. uneven: items differ in cost
    // (causal attention rows), so a thread takes a few chunks rather than one.
    template <typename F>
    void parallel_for(size_t items, size_t work_per_item, F&& fn, bool uneven = false) {
        constexpr size_t kMinWorkToSplit = 1 << 17;
        if (items * work_per_item < kMinWorkToSplit) {
            fn(size_t(0), items);
        } else {
            pool_.parallel_for(items, fn, uneven ? 4 : 1);
        }
    }
    void fail(Status s) {
        if (pending_.ok()) pending_ = std::move(s);
    }

    specula_device_info info_{};
    OpProfile profile_;
    ThreadPool pool_;
    bool int8_inputs_;              // options.int8_inputs
    bool amx_;                      // options.amx, where cpu::amx_available()
    cpu::QuantizedInputArrays qx_;  // quantized(): the inputs of the current matmul
    struct {                        // where qx_ was read from
        const Buffer* buffer = nullptr;
        size_t offset = 0, bytes = 0;
        int64_t cols = 0, rows = 0;
    } quantized_from_;
    Status pending_;
    uint64_t host_waits_ = 0;
    std::array<std::chrono::steady_clock::time_point, kTimeSlots> marks_{};
};

}  // namespace

namespace {

const cpu::SimdChoice& simd_choice() {
    static const cpu::SimdChoice choice = [] {
        const char* name = cpu_simd_requested();
        return name ? cpu::use_simd_target(name) : cpu::SimdChoice::kChosen;
    }();
    return choice;
}

}  // namespace

Status cpu_simd_environment() {
    const cpu::SimdChoice choice = simd_choice();
    if (choice == cpu::SimdChoice::kChosen) return Status::Ok();
    const std::string what = std::string("SPECULA_CPU_SIMD=") + cpu_simd_requested() +
                             (choice == cpu::SimdChoice::kNotRunnableHere
                                  ? ": not an instruction set this build runs on this CPU"
                                  : ": not an instruction set of this architecture") +
                             " (this build runs " + cpu::runnable_simd_targets() + " here)";
    return {choice == cpu::SimdChoice::kNotRunnableHere ? SPECULA_ERR_NO_DEVICE
                                                        : SPECULA_ERR_INVALID_ARGUMENT,
            what};
}

std::unique_ptr<Backend> create_cpu_backend(int n_threads, const specula_backend_options& options) {
    if (simd_choice() != cpu::SimdChoice::kChosen)
        log(SPECULA_LOG_WARN, cpu_simd_environment().message() + "; running the best one");
    if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
    return std::make_unique<CpuBackend>(n_threads, options);
}

}  // namespace specula
