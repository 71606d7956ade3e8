#include "vulkan_loader.h"

#include <dlfcn.h>

#include <mutex>

namespace specula::vk {

#define SPECULA_VK_DEFINE(name) PFN_##name name = nullptr;
SPECULA_VK_GLOBAL_FUNCTIONS(SPECULA_VK_DEFINE)
SPECULA_VK_INSTANCE_FUNCTIONS(SPECULA_VK_DEFINE)
SPECULA_VK_DEVICE_FUNCTIONS(SPECULA_VK_DEFINE)
#undef SPECULA_VK_DEFINE

namespace {
PFN_vkGetInstanceProcAddr get_instance_proc = nullptr;
}

bool load_library() {
    static std::once_flag once;
    static bool ok = false;
    std::call_once(once, [] {
        void* lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) lib = dlopen("libvulkan.so", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) return;  // kept open for the life of the process
        get_instance_proc =
            reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(lib, "vkGetInstanceProcAddr"));
        if (get_instance_proc == nullptr) return;
#define SPECULA_VK_LOAD(name) \
    name = reinterpret_cast<PFN_##name>(get_instance_proc(nullptr, #name));
        SPECULA_VK_GLOBAL_FUNCTIONS(SPECULA_VK_LOAD)
#undef SPECULA_VK_LOAD
        ok = vkCreateInstance != nullptr;
    });
    return ok;
}

void load_instance_functions(VkInstance instance) {
#define SPECULA_VK_LOAD(name) \
    name = reinterpret_cast<PFN_##name>(get_instance_proc(instance, #name));
    SPECULA_VK_INSTANCE_FUNCTIONS(SPECULA_VK_LOAD)
    SPECULA_VK_DEVICE_FUNCTIONS(SPECULA_VK_LOAD)
#undef SPECULA_VK_LOAD
}

}  // namespace specula::vk
