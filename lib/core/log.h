#pragma once

#include <string>

#include "specula.h"

namespace specula {

// Sends a message to the sink set by specula_set_log_callback; without one,
// warnings and errors go to stderr.
void log(specula_log_level level, const std::string& message);
void set_log_sink(specula_log_fn sink, void* user_data);

}  // namespace specula
