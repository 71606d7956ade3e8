// Loads the Vulkan loader library (libvulkan.so.1) at run time, so that the
// runtime starts, and the cpu backend works, on machines without Vulkan.
// Every Vulkan entry point specula uses is a function pointer declared here.
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

namespace specula::vk {

#define SPECULA_VK_GLOBAL_FUNCTIONS(X)    \
    X(vkCreateInstance)                   \
    X(vkEnumerateInstanceLayerProperties) \
    X(vkEnumerateInstanceVersion)

#define SPECULA_VK_INSTANCE_FUNCTIONS(X)        \
    X(vkDestroyInstance)                        \
    X(vkEnumeratePhysicalDevices)               \
    X(vkGetPhysicalDeviceProperties)            \
    X(vkGetPhysicalDeviceProperties2)           \
    X(vkGetPhysicalDeviceFeatures2)             \
    X(vkGetPhysicalDeviceMemoryProperties)      \
    X(vkGetPhysicalDeviceQueueFamilyProperties) \
    X(vkEnumerateDeviceExtensionProperties)     \
    X(vkCreateDevice)                           \
    X(vkCreateDebugUtilsMessengerEXT)           \
    X(vkDestroyDebugUtilsMessengerEXT)

#define SPECULA_VK_DEVICE_FUNCTIONS(X) \
    X(vkDestroyDevice)                 \
    X(vkGetDeviceQueue)                \
    X(vkDeviceWaitIdle)                \
    X(vkCreateBuffer)                  \
    X(vkDestroyBuffer)                 \
    X(vkGetBufferMemoryRequirements)   \
    X(vkAllocateMemory)                \
    X(vkFreeMemory)                    \
    X(vkBindBufferMemory)              \
    X(vkMapMemory)                     \
    X(vkUnmapMemory)                   \
    X(vkCreateShaderModule)            \
    X(vkDestroyShaderModule)           \
    X(vkCreatePipelineCache)           \
    X(vkDestroyPipelineCache)          \
    X(vkCreateComputePipelines)        \
    X(vkDestroyPipeline)               \
    X(vkCreatePipelineLayout)          \
    X(vkDestroyPipelineLayout)         \
    X(vkCreateDescriptorSetLayout)     \
    X(vkDestroyDescriptorSetLayout)    \
    X(vkCreateDescriptorPool)          \
    X(vkDestroyDescriptorPool)         \
    X(vkResetDescriptorPool)           \
    X(vkAllocateDescriptorSets)        \
    X(vkUpdateDescriptorSets)          \
    X(vkCreateCommandPool)             \
    X(vkDestroyCommandPool)            \
    X(vkAllocateCommandBuffers)        \
    X(vkResetCommandBuffer)            \
    X(vkBeginCommandBuffer)            \
    X(vkEndCommandBuffer)              \
    X(vkCmdBindPipeline)               \
    X(vkCmdBindDescriptorSets)         \
    X(vkCmdPushConstants)              \
    X(vkCmdDispatch)                   \
    X(vkCmdPipelineBarrier)            \
    X(vkCmdCopyBuffer)                 \
    X(vkCmdFillBuffer)                 \
    X(vkCreateQueryPool)               \
    X(vkDestroyQueryPool)              \
    X(vkCmdResetQueryPool)             \
    X(vkCmdWriteTimestamp)             \
    X(vkGetQueryPoolResults)           \
    X(vkCreateFence)                   \
    X(vkDestroyFence)                  \
    X(vkResetFences)                   \
    X(vkWaitForFences)                 \
    X(vkQueueSubmit)

#define SPECULA_VK_DECLARE(name) extern PFN_##name name;
SPECULA_VK_GLOBAL_FUNCTIONS(SPECULA_VK_DECLARE)
SPECULA_VK_INSTANCE_FUNCTIONS(SPECULA_VK_DECLARE)
SPECULA_VK_DEVICE_FUNCTIONS(SPECULA_VK_DECLARE)
#undef SPECULA_VK_DECLARE

// Opens the loader once per process; false when no Vulkan loader is installed.
bool load_library();
// Resolves instance- and device-level pointers through the instance. Device
// functions come as the loader's trampolines, which dispatch on the handle, so
// several devices (even of different drivers) share these pointers.
void load_instance_functions(VkInstance instance);

}  // namespace specula::vk
