// What the C API's translation units share: the backend handle, and the translation of Status
// (and of any exception from the standard library) into specula_status.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>

#include "backend/backend.h"
#include "core/log.h"
#include "decode/generator.h"
#include "specula.h"

// A backend records ops of one sequence at a time (the cpu backend's pending status and
// timestamps, a GPU backend's command buffer), so sessions that share it from several threads
// take turns: every call that records on, allocates from or frees into a backend holds its
// lock (a generation step, an evaluation, a load, a session's creation or end).
struct specula_backend {
    std::unique_ptr<specula::Backend> impl;
    std::mutex turn;
};

namespace specula::api {

// The calling thread's last error message.
std::string& last_error();

inline specula_status report(const Status& s) {
    if (s.ok()) return SPECULA_OK;
    last_error() = s.message();
    specula::log(SPECULA_LOG_DEBUG,
                 std::string(specula_status_name(s.code())) + ": " + s.message());
    return s.code();
}

// Runs an API body; no exception crosses the C boundary.
template <typename F>
specula_status guarded(F&& body) {
    try {
        return report(body());
    } catch (const std::bad_alloc&) {
        return report(OutOfMemory("out of host memory"));
    } catch (const std::exception& e) {
        return report({SPECULA_ERR_INTERNAL, std::string("internal error: ") + e.what()});
    }
}

// A C enum field as the integer the caller stored: checked before it is used as the enum (a
// value outside the enumerators is undefined behaviour to load as one in C++).
template <typename E>
int enum_value(const E& e) {
    std::underlying_type_t<E> v;
    std::memcpy(&v, &e, sizeof v);
    return int(v);
}

// A speculative decoder's γ settings from the C API (text sessions and speech alike);
// same_output: whether the output is the same at every γ (greedy decoding, the coupled
// acceptance), which SPECULA_GAMMA_AUTO resolves by.
inline Status gamma_settings(const specula_gamma_policy& policy, int32_t gamma, int32_t gamma_max,
                             bool same_output, Generator::Config* out) {
    if (gamma < 1 || gamma > kMaxGamma || gamma_max < 1 || gamma_max > kMaxGamma)
        return InvalidArgument("gamma and gamma_max must lie in 1.." + std::to_string(kMaxGamma));
    int value = enum_value(policy);
    if (value < SPECULA_GAMMA_FIXED || value > SPECULA_GAMMA_AUTO)
        return InvalidArgument("unknown gamma policy");
    if (value == SPECULA_GAMMA_AUTO)
        value = same_output ? SPECULA_GAMMA_ANALYTIC : SPECULA_GAMMA_HEURISTIC;
    out->policy = value == SPECULA_GAMMA_FIXED      ? GammaPolicy::kFixed
                  : value == SPECULA_GAMMA_ANALYTIC ? GammaPolicy::kAnalytic
                                                    : GammaPolicy::kHeuristic;
    out->gamma = gamma;
    out->gamma_max = gamma_max;
    return Status::Ok();
}

inline Status need(const void* p, const char* what) {
    return p != nullptr ? Status::Ok() : InvalidArgument(std::string(what) + " is NULL");
}

// The C API's contract for bytes handed back: *length is the byte count, BUFFER_TOO_SMALL (with
// the count) when `capacity` is short, no terminator written.
inline Status copy_bytes_out(const std::string& s, char* text, size_t capacity, size_t* length) {
    *length = s.size();
    if (s.size() > capacity)
        return Status(SPECULA_ERR_BUFFER_TOO_SMALL,
                      "the text needs " + std::to_string(s.size()) + " bytes");
    if (!s.empty()) std::memcpy(text, s.data(), s.size());  // text may be NULL otherwise
    return Status::Ok();
}

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

template <size_t N>
void copy_string(char (&dst)[N], const std::string& src) {
    std::snprintf(dst, N, "%s", src.c_str());
}

}  // namespace specula::api
