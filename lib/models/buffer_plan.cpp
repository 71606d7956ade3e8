#include "models/buffer_plan.h"

#include <cstdio>

namespace specula {

uint64_t BufferPlan::bytes() const {
    uint64_t need = 0;
    for (const Item& i : items_)
        need += Tensor{nullptr, 0, i.type, i.cols, i.rows}.bytes();
    return need;
}

Status BufferPlan::check_fits(const Backend& backend, const std::string& what) const {
    const uint64_t need = bytes(), available = backend.available_memory();
    if (available == 0 || need <= available) return Status::Ok();
    constexpr double kMiB = 1024.0 * 1024.0;
    char numbers[160];
    std::snprintf(numbers, sizeof numbers, " needs %.1f MiB; the %s backend can give %.1f MiB",
                  double(need) / kMiB, specula_backend_kind_name(backend.info().kind),
                  double(available) / kMiB);
    return OutOfMemory(what + numbers);
}

Status BufferPlan::allocate(Backend& backend, std::vector<std::unique_ptr<Buffer>>* owner) const {
    for (const Item& i : items_) {
        *i.t = Tensor{nullptr, 0, i.type, i.cols, i.rows};
        std::unique_ptr<Buffer> buffer;
        SPECULA_TRY(backend.allocate(i.t->bytes(), &buffer));
        i.t->buffer = buffer.get();
        owner->push_back(std::move(buffer));
    }
    return Status::Ok();
}

}  // namespace specula
