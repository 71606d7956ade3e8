// Status values flow through the whole runtime and become `specula_status`
// at the C boundary; nothing in the library throws across it or aborts.
#pragma once

#include <string>
#include <utility>

#include "specula.h"

namespace specula {

class [[nodiscard]] Status {
  public:
    Status() = default;
    Status(specula_status code, std::string message) : code_(code), message_(std::move(message)) {}

    static Status Ok() { return {}; }

    bool ok() const { return code_ == SPECULA_OK; }
    specula_status code() const { return code_; }
    const std::string& message() const { return message_; }

  private:
    specula_status code_ = SPECULA_OK;
    std::string message_;
};

inline Status InvalidArgument(std::string m) {
    return {SPECULA_ERR_INVALID_ARGUMENT, std::move(m)};
}
inline Status FormatError(std::string m) {
    return {SPECULA_ERR_FORMAT, std::move(m)};
}
inline Status IoError(std::string m) {
    return {SPECULA_ERR_IO, std::move(m)};
}
inline Status Unsupported(std::string m) {
    return {SPECULA_ERR_UNSUPPORTED, std::move(m)};
}
inline Status OutOfMemory(std::string m) {
    return {SPECULA_ERR_OUT_OF_MEMORY, std::move(m)};
}

}  // namespace specula

#define SPECULA_TRY(expr)                                \
    do {                                                 \
        ::specula::Status specula_try_s_ = (expr);       \
        if (!specula_try_s_.ok()) return specula_try_s_; \
    } while (0)
