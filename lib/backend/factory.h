// Which backends this build has and how one is made: the one place that knows them all (the
// interface, backend.h, knows none).
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "specula.h"

namespace specula {

// Devices of every compiled-in backend; the cpu is always first.
std::vector<specula_device_info> enumerate_devices();
Status create_backend(const specula_backend_params& params, std::unique_ptr<Backend>* out);

}  // namespace specula
