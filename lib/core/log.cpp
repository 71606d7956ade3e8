#include "core/log.h"

#include <cstdio>
#include <mutex>

namespace specula {

namespace {
std::mutex g_mutex;
specula_log_fn g_sink = nullptr;
void* g_user = nullptr;
}  // namespace

void set_log_sink(specula_log_fn sink, void* user_data) {
    std::lock_guard lock(g_mutex);
    g_sink = sink;
    g_user = user_data;
}

void log(specula_log_level level, const std::string& message) {
    std::lock_guard lock(g_mutex);
    if (g_sink != nullptr) {
        g_sink(level, message.c_str(), g_user);
    } else if (level >= SPECULA_LOG_WARN) {
        std::fprintf(stderr, "specula: %s\n", message.c_str());
    }
}

}  // namespace specula
