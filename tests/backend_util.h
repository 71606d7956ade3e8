// Backends under test besides the cpu reference: every compiled-in GPU
// backend with a device present. Tests on a missing backend skip, saying why.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "backend/factory.h"
#include "backend/options.h"
#ifdef SPECULA_HAVE_VULKAN
#include "backend/vulkan/vulkan_backend.h"
#endif

namespace specula::test {

inline const char* backend_name(specula_backend_kind kind) {
    return specula_backend_kind_name(kind);
}

// The backend with `options` (and, on the cpu, `n_threads`; 0 = all), or nullptr with *why set
// when it cannot be created here.
inline std::unique_ptr<Backend> try_backend(specula_backend_kind kind, std::string* why,
                                            const specula_backend_options& options = {},
                                            int n_threads = 0) {
    specula_backend_params p = specula_backend_default_params();
    p.kind = kind;
    p.options = options;
    p.n_threads = n_threads;
    std::unique_ptr<Backend> b;
    const Status s = create_backend(p, &b);
    if (!s.ok()) *why = std::string("no ") + backend_name(kind) + " device: " + s.message();
    return b;
}

// Environment variable `name` set to `value` for the guard's lifetime, then restored.
class ScopedEnv {
  public:
    ScopedEnv(const char* name, const char* value) : name_(name) {
        if (const char* before = std::getenv(name); before != nullptr) saved_ = before;
        setenv(name, value, 1);
    }
    ~ScopedEnv() {
        if (saved_) {
            setenv(name_, saved_->c_str(), 1);
        } else {
            unsetenv(name_);
        }
    }
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

  private:
    const char* name_;
    std::optional<std::string> saved_;
};

// Options with one path forced on or off.
inline specula_backend_options with_path(specula_path specula_backend_options::*path, bool on,
                                         specula_backend_options options = {}) {
    options.*path = on ? SPECULA_PATH_ON : SPECULA_PATH_OFF;
    return options;
}

// Has every cpu backend made from now on (unless told otherwise) multiply quantized weights with
// float inputs, as Vulkan does: for the tests that compare a GPU backend with the cpu, which make
// a cpu with 8-bit inputs where the GPU quantizes its inputs (Backend::quantizes_inputs; the
// 8-bit inputs are also tested against NumPy and in test_llama). Returns true.
inline bool compare_gpus_with_float_inputs_on_the_cpu() {
    return setenv("SPECULA_CPU_FLOAT_INPUTS", "1", 1) == 0;
}

#define SPECULA_BACKEND_OR_SKIP(var, kind)                                                    \
    std::string var##_why;                                                                    \
    std::unique_ptr<::specula::Backend> var = ::specula::test::try_backend(kind, &var##_why); \
    if (!var) GTEST_SKIP() << var##_why

#ifdef SPECULA_HAVE_VULKAN
// With SPECULA_VULKAN_VALIDATION=1 (CTest sets it for these tests) every test
// fails if the Khronos validation layer reported an error.
class VulkanValidationCheck : public ::testing::Environment {
  public:
    void SetUp() override {
        if (vulkan_validation_requested() && !enumerate_vulkan_devices().empty()) {
            EXPECT_TRUE(vulkan_validation_enabled())
                << "validation was requested but the layer did not load";
        }
    }
    void TearDown() override {
        EXPECT_EQ(vulkan_validation_error_count(), 0u)
            << "the Vulkan validation layer reported errors (see the log)";
    }
};
inline ::testing::Environment* const vulkan_validation_check =
    ::testing::AddGlobalTestEnvironment(new VulkanValidationCheck);  // gtest owns it
#endif

}  // namespace specula::test
