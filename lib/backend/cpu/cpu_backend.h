#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace specula {

// n_threads <= 0: every hardware thread.
std::unique_ptr<Backend> create_cpu_backend(int n_threads);

}  // namespace specula
