// The SPECULA_* environment switches of the backends (docs/DESIGN.md names each where it is
// used): whether one is set to a given value.
#pragma once

#include <cstdlib>
#include <cstring>

namespace specula {

inline bool env_is(const char* name, const char* value) {
    const char* env = std::getenv(name);
    return env != nullptr && std::strcmp(env, value) == 0;
}

}  // namespace specula
