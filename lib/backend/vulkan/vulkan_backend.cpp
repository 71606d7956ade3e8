#include "backend/vulkan/vulkan_backend.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "backend/options.h"
#include "backend/vulkan/shaders.h"
#include "core/detmath.h"
#include "core/device_abi.h"
#include "core/log.h"
#include "platform/vulkan_loader.h"

namespace specula {

namespace {

std::atomic<uint64_t> g_validation_errors{0};

Status vk_check(VkResult r, const std::string& what) {
    switch (r) {
        case VK_SUCCESS:
            return Status::Ok();
        case VK_ERROR_OUT_OF_HOST_MEMORY:
            return OutOfMemory(what + ": out of host memory");
        case VK_ERROR_OUT_OF_DEVICE_MEMORY:
            return OutOfMemory(what + ": out of device memory");
        case VK_ERROR_DEVICE_LOST:
            return {SPECULA_ERR_DEVICE_LOST, what + ": the Vulkan device was lost"};
        case VK_ERROR_INITIALIZATION_FAILED:
        case VK_ERROR_INCOMPATIBLE_DRIVER:
        case VK_ERROR_LAYER_NOT_PRESENT:
        case VK_ERROR_EXTENSION_NOT_PRESENT:
        case VK_ERROR_FEATURE_NOT_PRESENT:
            return {SPECULA_ERR_NO_DEVICE,
                    what + ": no usable Vulkan driver (VkResult " + std::to_string(int(r)) + ")"};
        default:
            return {SPECULA_ERR_INTERNAL, what + " failed with VkResult " + std::to_string(int(r))};
    }
}

VKAPI_ATTR VkBool32 VKAPI_CALL on_validation_message(
    VkDebugUtilsMessageSeverityFlagBitsEXT severity, VkDebugUtilsMessageTypeFlagsEXT,
    const VkDebugUtilsMessengerCallbackDataEXT* data, void*) {
    if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
        ++g_validation_errors;
        log(SPECULA_LOG_ERROR, std::string("vulkan validation: ") + data->pMessage);
    } else if (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
        log(SPECULA_LOG_WARN, std::string("vulkan validation: ") + data->pMessage);
    }
    return VK_FALSE;
}

// One VkInstance per process, created on first use and kept for its lifetime
// (drivers dislike instances created and destroyed repeatedly).
struct Instance {
    VkInstance handle = VK_NULL_HANDLE;
    VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
    bool validation = false;
};

Status instance(const Instance** out) {
    static std::once_flag once;
    static Instance inst;
    static Status status;
    std::call_once(once, [] {
        if (!vk::load_library()) {
            status = {SPECULA_ERR_NO_DEVICE, "no Vulkan loader (libvulkan.so.1) is installed"};
            return;
        }
        bool want_validation = vulkan_validation_requested();
        if (want_validation) {
            uint32_t n = 0;
            vk::vkEnumerateInstanceLayerProperties(&n, nullptr);
            std::vector<VkLayerProperties> layers(n);
            vk::vkEnumerateInstanceLayerProperties(&n, layers.data());
            want_validation =
                std::any_of(layers.begin(), layers.end(), [](const VkLayerProperties& l) {
                    return std::strcmp(l.layerName, "VK_LAYER_KHRONOS_validation") == 0;
                });
            if (!want_validation)
                log(SPECULA_LOG_WARN,
                    "SPECULA_VULKAN_VALIDATION=1 but the validation layer is not installed");
        }
        VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
        app.pApplicationName = "specula";
        app.pEngineName = "specula";
        // The newest version whose features are queried (a device reports its own).
        app.apiVersion = VK_API_VERSION_1_3;
        const char* layer = "VK_LAYER_KHRONOS_validation";
        const std::array<const char*, 2> extensions = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME,
                                                       VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME};
        // Synchronization validation too: barriers are placed only where one dispatch
        // depends on another, and the layer reports any hazard left without one.
        const VkValidationFeatureEnableEXT sync =
            VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT;
        VkValidationFeaturesEXT features{VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT};
        features.enabledValidationFeatureCount = 1;
        features.pEnabledValidationFeatures = &sync;
        VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
        ci.pApplicationInfo = &app;
        if (want_validation) {
            ci.pNext = &features;
            ci.enabledLayerCount = 1;
            ci.ppEnabledLayerNames = &layer;
            ci.enabledExtensionCount = uint32_t(extensions.size());
            ci.ppEnabledExtensionNames = extensions.data();
        }
        status = vk_check(vk::vkCreateInstance(&ci, nullptr, &inst.handle), "vkCreateInstance");
        if (!status.ok()) return;
        vk::load_instance_functions(inst.handle);
        inst.validation = want_validation;
        if (want_validation && vk::vkCreateDebugUtilsMessengerEXT != nullptr) {
            VkDebugUtilsMessengerCreateInfoEXT mi{
                VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
            mi.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                                 VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
            mi.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                             VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                             VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
            mi.pfnUserCallback = on_validation_message;
            vk::vkCreateDebugUtilsMessengerEXT(inst.handle, &mi, nullptr, &inst.messenger);
        }
    });
    *out = &inst;
    return status;
}

struct PhysicalDevice {
    VkPhysicalDevice handle = VK_NULL_HANDLE;
    uint32_t queue_family = 0;
    bool timestamps = false;  // the compute queue can write timestamps
    // Subgroup size of the matmul's sums over subgroups (a butterfly in one fixed order), 0
    // where it sums in shared memory: the device's one size, or where the driver may choose
    // among several, the one its pipelines require (pin_subgroup, Vulkan 1.3's subgroup size
    // control) (matmul_subgroup()).
    uint32_t fixed_subgroup = 0;
    bool pin_subgroup = false;
    // Storage buffers readable as 8- and 16-bit values (Vulkan 1.2 features): weight readers
    // then load halves and bytes as such (the shaders' _small variants).
    bool small_storage = false;
    specula_device_info info{};
    int rank = 0;  // lower is preferred
};

constexpr uint32_t kMatmulThreads = 128;  // backend/vulkan/shaders/matmul.comp's workgroup

struct SubgroupChoice {
    uint32_t size = 0;
    bool pinned = false;
};

// The matmul's subgroup size: usable where shuffles work in compute shaders and the size is one
// power of two of at most the workgroup, whole subgroups filling it. A device whose driver may
// pick any of several sizes per pipeline (Intel, AMD, many mobile GPUs) would let the n = 1 and
// n = γ + 1 pipelines sum in different orders, so there the size is pinned: every pipeline
// that sums over subgroups requires it, with full subgroups (Vulkan 1.3's subgroupSizeControl
// and computeFullSubgroups), 32 where the device allows it, else its nearest size.
// Options: subgroups off: none (the shared-memory sums); pin_subgroup off: no pinning, on: pinned
// even where the device has one size (its own: what the tests check).
SubgroupChoice matmul_subgroup(VkPhysicalDevice h, uint32_t api_version, uint32_t workgroup,
                               const specula_backend_options& options) {
    if (options.subgroups == SPECULA_PATH_OFF) return {};  // tests the fallback
    // Before Vulkan 1.3 nothing says that the size is the same in every pipeline.
    if (api_version < VK_API_VERSION_1_3) return {};
    VkPhysicalDeviceSubgroupSizeControlProperties control{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES};
    VkPhysicalDeviceSubgroupProperties subgroup{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES, &control};
    VkPhysicalDeviceProperties2 props2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &subgroup};
    vk::vkGetPhysicalDeviceProperties2(h, &props2);
    VkPhysicalDeviceVulkan13Features v13{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES};
    VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &v13};
    vk::vkGetPhysicalDeviceFeatures2(h, &features);
    if (!(subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) ||
        !(subgroup.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT))
        return {};
    const auto fits = [&](uint32_t size) {
        return size >= 4 && size <= workgroup && (size & (size - 1)) == 0 && workgroup % size == 0;
    };
    const bool one_size = control.minSubgroupSize == control.maxSubgroupSize &&
                          control.minSubgroupSize == subgroup.subgroupSize;
    const bool force_pin = options.pin_subgroup == SPECULA_PATH_ON;
    if (one_size && !force_pin)
        return fits(subgroup.subgroupSize) ? SubgroupChoice{subgroup.subgroupSize, false}
                                           : SubgroupChoice{};
    const bool can_pin = v13.subgroupSizeControl && v13.computeFullSubgroups &&
                         (control.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT);
    if (!can_pin || options.pin_subgroup == SPECULA_PATH_OFF) return {};
    const uint32_t size = std::clamp(32u, control.minSubgroupSize, control.maxSubgroupSize);
    if (!fits(size) || workgroup / size > control.maxComputeWorkgroupSubgroups) return {};
    return {size, true};
}

// Whether weights are read through 8/16-bit storage (the small_storage option): on GPUs that
// have it, not on CPU devices (on llvmpipe the byte loads made decoding about 10% slower than
// the word reads).
bool use_small_storage(VkPhysicalDevice h, const VkPhysicalDeviceProperties& props,
                       const specula_backend_options& options) {
    if (!path_on(options.small_storage, props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU))
        return false;
    if (props.apiVersion < VK_API_VERSION_1_2) return false;
    VkPhysicalDeviceVulkan12Features v12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceVulkan11Features v11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                         &v12};
    VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &v11};
    vk::vkGetPhysicalDeviceFeatures2(h, &features);
    return v11.storageBuffer16BitAccess && v12.storageBuffer8BitAccess;
}

// The devices, with what `options` chooses for each (the defaults: for enumerating them).
std::vector<PhysicalDevice> physical_devices(const specula_backend_options& options = {}) {
    const Instance* inst = nullptr;
    if (!instance(&inst).ok()) return {};
    uint32_t n = 0;
    if (vk::vkEnumeratePhysicalDevices(inst->handle, &n, nullptr) != VK_SUCCESS) return {};
    std::vector<VkPhysicalDevice> handles(n);
    vk::vkEnumeratePhysicalDevices(inst->handle, &n, handles.data());
    std::vector<PhysicalDevice> out;
    for (VkPhysicalDevice h : handles) {
        VkPhysicalDeviceProperties props{};
        vk::vkGetPhysicalDeviceProperties(h, &props);
        if (props.apiVersion < VK_API_VERSION_1_1) continue;
        uint32_t nq = 0;
        vk::vkGetPhysicalDeviceQueueFamilyProperties(h, &nq, nullptr);
        std::vector<VkQueueFamilyProperties> queues(nq);
        vk::vkGetPhysicalDeviceQueueFamilyProperties(h, &nq, queues.data());
        auto q = std::find_if(queues.begin(), queues.end(), [](const VkQueueFamilyProperties& f) {
            return f.queueFlags & VK_QUEUE_COMPUTE_BIT;
        });
        if (q == queues.end()) continue;
        PhysicalDevice d;
        d.handle = h;
        d.queue_family = uint32_t(q - queues.begin());
        d.timestamps = q->timestampValidBits > 0 && props.limits.timestampPeriod > 0;
        const SubgroupChoice subgroup =
            matmul_subgroup(h, props.apiVersion, kMatmulThreads, options);
        d.fixed_subgroup = subgroup.size;
        d.pin_subgroup = subgroup.pinned;
        d.small_storage = use_small_storage(h, props, options);
        d.info.kind = SPECULA_BACKEND_VULKAN;
        std::snprintf(d.info.name, sizeof d.info.name, "%s", props.deviceName);
        d.info.is_discrete_gpu = props.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
        d.info.is_software = props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
        VkPhysicalDeviceMemoryProperties mem{};
        vk::vkGetPhysicalDeviceMemoryProperties(h, &mem);
        for (uint32_t i = 0; i < mem.memoryHeapCount; ++i)
            if (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
                d.info.memory_bytes += mem.memoryHeaps[i].size;
        switch (props.deviceType) {
            case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
                d.rank = 0;
                break;
            case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
                d.rank = 1;
                break;
            case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
                d.rank = 2;
                break;
            case VK_PHYSICAL_DEVICE_TYPE_CPU:
                d.rank = 3;
                break;
            default:
                d.rank = 4;
                break;
        }
        out.push_back(d);
    }
    std::stable_sort(out.begin(), out.end(), [](const PhysicalDevice& a, const PhysicalDevice& b) {
        return a.rank < b.rank;
    });
    for (size_t i = 0; i < out.size(); ++i)
        out[i].info.index = int32_t(i);
    return out;
}

// The logical device and what outlives any one object made from it.
struct Device {
    VkDevice handle = VK_NULL_HANDLE;
    VkPhysicalDeviceMemoryProperties memory{};
    VkPhysicalDeviceLimits limits{};
    // Buffers released while recorded commands may still use them: freed once
    // the device is idle (after the next flush).
    std::mutex graveyard_mutex;
    std::vector<std::pair<VkBuffer, VkDeviceMemory>> graveyard;

    void bury(VkBuffer b, VkDeviceMemory m) {
        std::lock_guard lock(graveyard_mutex);
        graveyard.emplace_back(b, m);
    }
    // Whether any buffer was destroyed (its handle may then come back for a new buffer).
    bool free_buried() {
        std::lock_guard lock(graveyard_mutex);
        for (auto [b, m] : graveyard) {
            if (b != VK_NULL_HANDLE) vk::vkDestroyBuffer(handle, b, nullptr);
            if (m != VK_NULL_HANDLE) vk::vkFreeMemory(handle, m, nullptr);
        }
        const bool freed = !graveyard.empty();
        graveyard.clear();
        return freed;
    }
    ~Device() {
        if (handle != VK_NULL_HANDLE) {
            vk::vkDeviceWaitIdle(handle);
            free_buried();
            vk::vkDestroyDevice(handle, nullptr);
        }
    }
};

class VulkanBuffer final : public Buffer {
  public:
    VulkanBuffer(std::shared_ptr<Device> device, size_t size)
        : device_(std::move(device)), size_(size) {}
    ~VulkanBuffer() override {
        if (mapped_ != nullptr) vk::vkUnmapMemory(device_->handle, memory_);
        device_->bury(buffer_, memory_);
    }
    VulkanBuffer(const VulkanBuffer&) = delete;
    VulkanBuffer& operator=(const VulkanBuffer&) = delete;

    // host_visible: mapped, coherent memory for staging; otherwise device-local where possible.
    Status create(bool host_visible) {
        VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
        // Whole 16-byte words: shaders read the buffer as 32-bit words, and a quantized
        // tensor's last block may end inside one.
        bi.size = capacity();
        bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                   VK_BUFFER_USAGE_TRANSFER_DST_BIT;
        bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
        SPECULA_TRY(vk_check(vk::vkCreateBuffer(device_->handle, &bi, nullptr, &buffer_),
                             "vkCreateBuffer"));
        VkMemoryRequirements req{};
        vk::vkGetBufferMemoryRequirements(device_->handle, buffer_, &req);
        const VkMemoryPropertyFlags want = host_visible ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                                              VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                                              VK_MEMORY_PROPERTY_HOST_CACHED_BIT
                                                        : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
        const VkMemoryPropertyFlags need = host_visible ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                                              VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
                                                        : 0;
        uint32_t type = UINT32_MAX;
        for (VkMemoryPropertyFlags flags : {want, need}) {
            for (uint32_t i = 0; i < device_->memory.memoryTypeCount && type == UINT32_MAX; ++i)
                if ((req.memoryTypeBits & (1u << i)) &&
                    (device_->memory.memoryTypes[i].propertyFlags & flags) == flags)
                    type = i;
        }
        if (type == UINT32_MAX) return {SPECULA_ERR_INTERNAL, "no suitable Vulkan memory type"};
        VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
        ai.allocationSize = req.size;
        ai.memoryTypeIndex = type;
        SPECULA_TRY(vk_check(vk::vkAllocateMemory(device_->handle, &ai, nullptr, &memory_),
                             "allocating " + std::to_string(req.size) + " bytes of device memory"));
        SPECULA_TRY(vk_check(vk::vkBindBufferMemory(device_->handle, buffer_, memory_, 0),
                             "vkBindBufferMemory"));
        if (host_visible)
            SPECULA_TRY(
                vk_check(vk::vkMapMemory(device_->handle, memory_, 0, VK_WHOLE_SIZE, 0, &mapped_),
                         "vkMapMemory"));
        return Status::Ok();
    }

    size_t size() const override { return size_; }
    size_t capacity() const { return std::max<size_t>((size_ + 15) & ~size_t(15), 16); }
    VkBuffer handle() const { return buffer_; }
    uint8_t* mapped() const { return static_cast<uint8_t*>(mapped_); }

    // A weight matrix larger than the device's storage-buffer range is held as parts of whole
    // rows, each its own buffer that a binding can cover; this buffer then has no memory of its
    // own, and the ops that read weights (matmul, get_rows) run once per part.
    struct Part {
        std::unique_ptr<VulkanBuffer> buffer;
        int64_t first_row = 0, rows = 0;
    };
    bool split() const { return !parts_.empty(); }
    const std::vector<Part>& parts() const { return parts_; }
    void add_part(std::unique_ptr<VulkanBuffer> b, int64_t first_row, int64_t rows) {
        parts_.push_back({std::move(b), first_row, rows});
    }

  private:
    std::vector<Part> parts_;
    std::shared_ptr<Device> device_;
    size_t size_;
    VkBuffer buffer_ = VK_NULL_HANDLE;
    VkDeviceMemory memory_ = VK_NULL_HANDLE;
    void* mapped_ = nullptr;
};

VulkanBuffer& vbuf(const Tensor& t) {
    return *static_cast<VulkanBuffer*>(t.buffer);
}

const char* weight_suffix(GgmlType t) {
    switch (t) {
        case GgmlType::kF32:
            return "f32";
        case GgmlType::kF16:
            return "f16";
        case GgmlType::kQ8_0:
            return "q8_0";
        case GgmlType::kQ4_0:
            return "q4_0";
        case GgmlType::kQ4_1:
            return "q4_1";
        case GgmlType::kQ5_0:
            return "q5_0";
        case GgmlType::kQ5_1:
            return "q5_1";
        case GgmlType::kQ4_K:
            return "q4_k";
        case GgmlType::kQ5_K:
            return "q5_k";
        case GgmlType::kQ6_K:
            return "q6_k";
        default:
            return nullptr;
    }
}

// Must match the push-constant block of backend/vulkan/shaders/common.glsl.
struct PushConstants {
    uint32_t off[6] = {};
    uint32_t u[12] = {};
    float f[2] = {};
};
constexpr uint32_t kBindings = 6;

constexpr uint32_t kMaxBatchColumns = 16;  // the widest N of backend/vulkan/shaders/matmul.comp
constexpr size_t kStagingBytes = 16u << 20;
constexpr uint32_t kSetsPerPool = 1024;

class VulkanBackend final : public Backend {
  public:
    ~VulkanBackend() override {
        if (!device_) return;
        VkDevice d = device_->handle;
        vk::vkDeviceWaitIdle(d);
        staging_.reset();
        readback_.reset();
        dummy_.reset();
        verify_scratch_.reset();
        mask_words_.reset();
        baseline_.clear();
        for (auto& [key, p] : pipelines_)
            vk::vkDestroyPipeline(d, p, nullptr);
        for (VkDescriptorPool p : pools_)
            vk::vkDestroyDescriptorPool(d, p, nullptr);
        if (cache_) vk::vkDestroyPipelineCache(d, cache_, nullptr);
        if (layout_) vk::vkDestroyPipelineLayout(d, layout_, nullptr);
        if (set_layout_) vk::vkDestroyDescriptorSetLayout(d, set_layout_, nullptr);
        if (fence_) vk::vkDestroyFence(d, fence_, nullptr);
        if (queries_) vk::vkDestroyQueryPool(d, queries_, nullptr);
        if (profile_) {
            vk::vkDestroyQueryPool(d, profile_, nullptr);
            print_profile();
        }
        if (pool_) vk::vkDestroyCommandPool(d, pool_, nullptr);
    }

    Status init(const PhysicalDevice& phys, const specula_backend_options& options) {
        phys_ = phys;
        info_ = phys.info;
        device_ = std::make_shared<Device>();
        VkPhysicalDeviceProperties props{};
        vk::vkGetPhysicalDeviceProperties(phys.handle, &props);
        device_->limits = props.limits;
        period_ns_ = props.limits.timestampPeriod;
        vk::vkGetPhysicalDeviceMemoryProperties(phys.handle, &device_->memory);

        const float priority = 1.0f;
        VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
        qi.queueFamilyIndex = phys.queue_family;
        qi.queueCount = 1;
        qi.pQueuePriorities = &priority;
        VkPhysicalDeviceVulkan12Features v12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
        v12.storageBuffer8BitAccess = VK_TRUE;
        VkPhysicalDeviceVulkan11Features v11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                             &v12};
        v11.storageBuffer16BitAccess = VK_TRUE;
        // A pinned subgroup size needs the two features that let pipelines require it.
        VkPhysicalDeviceVulkan13Features v13{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES,
                                             phys.small_storage ? &v11 : nullptr};
        v13.subgroupSizeControl = VK_TRUE;
        v13.computeFullSubgroups = VK_TRUE;
        VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
        di.pNext = phys.pin_subgroup    ? static_cast<void*>(&v13)
                   : phys.small_storage ? static_cast<void*>(&v11)
                                        : nullptr;
        di.queueCreateInfoCount = 1;
        di.pQueueCreateInfos = &qi;
        SPECULA_TRY(vk_check(vk::vkCreateDevice(phys.handle, &di, nullptr, &device_->handle),
                             "vkCreateDevice"));
        VkDevice d = device_->handle;
        vk::vkGetDeviceQueue(d, phys.queue_family, 0, &queue_);

        VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
        pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
        pi.queueFamilyIndex = phys.queue_family;
        SPECULA_TRY(
            vk_check(vk::vkCreateCommandPool(d, &pi, nullptr, &pool_), "vkCreateCommandPool"));
        VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
        ai.commandPool = pool_;
        ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
        ai.commandBufferCount = 1;
        SPECULA_TRY(
            vk_check(vk::vkAllocateCommandBuffers(d, &ai, &cmd_), "vkAllocateCommandBuffers"));
        VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        SPECULA_TRY(vk_check(vk::vkCreateFence(d, &fi, nullptr, &fence_), "vkCreateFence"));
        // barrier_every_dispatch: a baseline for measuring what the dependency-only barriers
        // gain.
        barrier_every_dispatch_ = options.barrier_every_dispatch;
        // The matmuls apply the norms (one dispatch and barrier fewer per norm), except on CPU
        // devices: there dispatches cost little and the extra multiplies showed (llvmpipe
        // decoded about 10% slower). The fused_norm and fused_rope options force either; the
        // ops on their own are the baseline gpu_report measures these against.
        fuse_norm_ = path_on(options.fused_norm, !info_.is_software);
        fuse_rope_ = path_on(options.fused_rope, true);
        if (options.max_binding_bytes > 0)
            max_range_ = size_t(std::max<uint64_t>(1, options.max_binding_bytes));
        // The tiled matmul on GPUs; on llvmpipe (which runs a workgroup's barriers as switches
        // between its threads) a tiny-shaped encoder took 1.2x as long as with slices of 16.
        // Its workgroup and shared memory pass what Vulkan guarantees (128 invocations, 16 KiB):
        // devices with less keep the slices.
        const VkPhysicalDeviceLimits& lim = device_->limits;
        const bool tiles_fit =
            lim.maxComputeWorkGroupInvocations >= shared::kMatmulTileThreads &&
            lim.maxComputeWorkGroupSize[0] >= shared::kMatmulTileThreads &&
            lim.maxComputeSharedMemorySize >=
                2 * shared::kBlockWeights * (shared::kMatmulTile + 1) * sizeof(float);
        tiled_ = tiles_fit && path_on(options.tiled, !info_.is_software);
        if (phys.timestamps) {
            VkQueryPoolCreateInfo qpi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
            qpi.queryType = VK_QUERY_TYPE_TIMESTAMP;
            qpi.queryCount = kTimeSlots;
            SPECULA_TRY(
                vk_check(vk::vkCreateQueryPool(d, &qpi, nullptr, &queries_), "vkCreateQueryPool"));
            if (options.profile) {
                qpi.queryCount = kProfileQueries;
                SPECULA_TRY(vk_check(vk::vkCreateQueryPool(d, &qpi, nullptr, &profile_),
                                     "vkCreateQueryPool"));
            }
        }

        std::array<VkDescriptorSetLayoutBinding, kBindings> bindings{};
        for (uint32_t i = 0; i < kBindings; ++i) {
            bindings[i].binding = i;
            bindings[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
            bindings[i].descriptorCount = 1;
            bindings[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
        }
        VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
        li.bindingCount = kBindings;
        li.pBindings = bindings.data();
        SPECULA_TRY(vk_check(vk::vkCreateDescriptorSetLayout(d, &li, nullptr, &set_layout_),
                             "vkCreateDescriptorSetLayout"));
        VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(PushConstants)};
        VkPipelineLayoutCreateInfo pli{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
        pli.setLayoutCount = 1;
        pli.pSetLayouts = &set_layout_;
        pli.pushConstantRangeCount = 1;
        pli.pPushConstantRanges = &range;
        SPECULA_TRY(vk_check(vk::vkCreatePipelineLayout(d, &pli, nullptr, &layout_),
                             "vkCreatePipelineLayout"));
        VkPipelineCacheCreateInfo ci{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
        SPECULA_TRY(
            vk_check(vk::vkCreatePipelineCache(d, &ci, nullptr, &cache_), "vkCreatePipelineCache"));

        SPECULA_TRY(make_buffer(kStagingBytes, true, &staging_));
        SPECULA_TRY(make_buffer(16, false, &dummy_));
        return begin();
    }

    const specula_device_info& info() const override { return info_; }
    bool supports(Op op, GgmlType type) const override {
        const bool reads = weight_suffix(type) != nullptr;
        switch (op) {
            case Op::kMatmulRope:
                return reads && fuse_rope_;
            case Op::kNormedMatmul:
                return fuse_norm_;
            case Op::kMaskLogits:
                return true;
            default:  // the matmul shader's GATED variant runs every type it reads
                return reads;
        }
    }
    // The device-local heaps' size: an upper bound (what others use of them is not known
    // without VK_EXT_memory_budget), enough to refuse a context that can never fit.
    uint64_t available_memory() const override { return info_.memory_bytes; }
    bool reads_small_storage() const { return phys_.small_storage; }
    uint32_t matmul_subgroup() const { return phys_.fixed_subgroup; }
    bool subgroup_pinned() const { return phys_.pin_subgroup; }

    Status allocate(size_t bytes, std::unique_ptr<Buffer>* out) override {
        SPECULA_TRY(usable());
        std::unique_ptr<VulkanBuffer> b;
        SPECULA_TRY(make_buffer(bytes, false, &b));
        vk::vkCmdFillBuffer(cmd_, b->handle(), 0, VK_WHOLE_SIZE, 0);
        barrier();
        *out = std::move(b);
        return Status::Ok();
    }

    Status load_weights(std::span<const uint8_t> host, GgmlType type, int64_t cols, int64_t rows,
                        WeightUse /*use*/, std::unique_ptr<Buffer>* out) override {
        SPECULA_TRY(usable());
        const size_t range = weight_range();
        if (host.size() <= range) return upload_weights(host, out);
        // Larger than a binding can cover: parts of whole rows.
        const size_t row_bytes = Tensor{nullptr, 0, type, cols, 1}.row_bytes();
        const auto part_rows = int64_t(range / row_bytes);
        if (part_rows == 0 || host.size() != row_bytes * size_t(rows))
            return Unsupported("a weight row of " + std::to_string(row_bytes) +
                               " bytes exceeds this device's " + std::to_string(range) +
                               "-byte storage-buffer range");
        auto whole = std::make_unique<VulkanBuffer>(device_, host.size());
        for (int64_t r0 = 0; r0 < rows; r0 += part_rows) {
            const int64_t n = std::min(part_rows, rows - r0);
            std::unique_ptr<Buffer> part;
            SPECULA_TRY(
                upload_weights(host.subspan(size_t(r0) * row_bytes, size_t(n) * row_bytes), &part));
            whole->add_part(
                std::unique_ptr<VulkanBuffer>(static_cast<VulkanBuffer*>(part.release())), r0, n);
        }
        *out = std::move(whole);
        return Status::Ok();
    }

    // The bytes a binding may cover: the device's storage-buffer range, or less where
    // SPECULA_VULKAN_MAX_RANGE asked when the backend was made (the tests split weights that
    // way on any device).
    size_t weight_range() const {
        return std::min<size_t>(device_->limits.maxStorageBufferRange, max_range_);
    }

    Status upload_weights(std::span<const uint8_t> host, std::unique_ptr<Buffer>* out) {
        std::unique_ptr<VulkanBuffer> b;
        SPECULA_TRY(make_buffer(host.size(), false, &b));
        for (size_t done = 0; done < host.size(); done += kStagingBytes) {
            const size_t n = std::min(kStagingBytes, host.size() - done);
            SPECULA_TRY(flush());  // the staging buffer is free once the previous chunk landed
            std::memcpy(staging_->mapped(), host.data() + done, n);
            const VkBufferCopy region{0, done, n};
            vk::vkCmdCopyBuffer(cmd_, staging_->handle(), b->handle(), 1, &region);
            barrier();
        }
        SPECULA_TRY(flush());
        *out = std::move(b);
        return Status::Ok();
    }

    void upload(const Tensor& dst, const void* src) override {
        if (!recording()) return;
        const size_t bytes = dst.bytes();
        if (dst.offset + bytes > dst.buffer->size())
            return fail(InvalidArgument("an upload reaches past the end of its buffer"));
        const auto* from = static_cast<const uint8_t*>(src);
        for (size_t done = 0; done < bytes;) {
            size_t at = (staging_used_ + 15) & ~size_t(15);
            if (at >= kStagingBytes) {
                // The staging space is still read by recorded copies: run them first.
                if (Status s = flush(); !s.ok()) return fail(std::move(s));
                at = 0;
            }
            const size_t n = std::min(bytes - done, kStagingBytes - at);
            std::memcpy(staging_->mapped() + at, from + done, n);
            staging_used_ = at + n;
            const VkBufferCopy region{at, dst.offset + done, n};
            settle();
            vk::vkCmdCopyBuffer(cmd_, staging_->handle(), vbuf(dst).handle(), 1, &region);
            barrier();
            done += n;
        }
    }

    Status download(const Tensor& src, void* dst) override {
        SPECULA_TRY(usable());
        const size_t bytes = src.bytes();
        if (src.offset + bytes > src.buffer->size())
            return InvalidArgument("a download reaches past the end of its buffer");
        if (!readback_ || readback_->size() < bytes) {
            // Safe to replace: only downloads use it, and each one waits for its copy.
            readback_.reset();
            SPECULA_TRY(make_buffer(std::max(bytes, size_t(1) << 20), true, &readback_));
        }
        const VkBufferCopy region{src.offset, 0, bytes};
        settle();
        vk::vkCmdCopyBuffer(cmd_, vbuf(src).handle(), readback_->handle(), 1, &region);
        ++n_recorded_;  // a download right after another must still be submitted
        SPECULA_TRY(flush());
        std::memcpy(dst, readback_->mapped(), bytes);
        return Status::Ok();
    }

    Status flush() override {
        if (lost_)
            return {SPECULA_ERR_DEVICE_LOST, "the Vulkan device was lost; create a new backend"};
        Status s = std::move(pending_);
        pending_ = Status::Ok();
        VkResult r = vk::vkEndCommandBuffer(cmd_);
        const auto recorded = std::chrono::steady_clock::now();
        if (profile_) profile_host_.record_s += seconds(recorded - recording_since_);
        if (s.ok() && r == VK_SUCCESS && n_recorded_ > 0) {
            VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
            si.commandBufferCount = 1;
            si.pCommandBuffers = &cmd_;
            r = vk::vkQueueSubmit(queue_, 1, &si, fence_);
            if (r == VK_SUCCESS) {
                r = vk::vkWaitForFences(device_->handle, 1, &fence_, VK_TRUE, UINT64_MAX);
                ++host_waits_;
                vk::vkResetFences(device_->handle, 1, &fence_);
            }
        }
        if (r == VK_ERROR_DEVICE_LOST) lost_ = true;
        if (r == VK_SUCCESS && marked_ != 0) read_marks();
        if (r == VK_SUCCESS && profile_ && n_recorded_ > 0) read_profile(recorded);
        if (!lost_ && device_->free_buried()) forget_descriptor_sets();
        if (s.ok()) s = vk_check(r, "submitting work to the Vulkan device");
        if (lost_) return s;
        if (Status b = begin(); s.ok()) s = std::move(b);
        return s;
    }

    uint64_t host_waits() const override { return host_waits_; }

    void mark_time(int slot) override {
        if (!queries_ || !recording()) return;
        vk::vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_,
                                uint32_t(slot));
        marked_ |= 1u << slot;
        ++n_recorded_;
    }
    double seconds_between(int from, int to) const override {
        const double ticks = double(int64_t(ticks_[size_t(to)] - ticks_[size_t(from)]));
        return ticks * double(period_ns_) * 1e-9;
    }

    void get_rows(const Tensor& table, const Tensor& ids, const Tensor& out) override {
        PushConstants pc;
        pc.u[0] = uint32_t(table.cols);
        pc.u[1] = uint32_t(ids.cols * ids.rows);
        pc.u[2] = uint32_t(table.rows);
        pc.u[3] = 0;  // the table's rows [u3, u3 + u4) are bound; ids of other rows are skipped
        pc.u[4] = uint32_t(table.rows);
        if (!vbuf(table).split())
            return dispatch_typed("get_rows", table.type, {&table, &ids, &out}, kWrites2, pc,
                                  pc.u[1], {64, 1, 1});
        for (const auto& part : vbuf(table).parts()) {
            const Tensor t{part.buffer.get(), 0, table.type, table.cols, part.rows};
            pc.u[3] = uint32_t(part.first_row);
            pc.u[4] = uint32_t(part.rows);
            dispatch_typed("get_rows", table.type, {&t, &ids, &out}, kWrites2, pc, pc.u[1],
                           {64, 1, 1});
        }
    }

    void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) override {
        PushConstants pc;
        pc.u[0] = uint32_t(x.cols);
        pc.u[1] = uint32_t(x.rows);
        pc.f[0] = eps;
        // About four elements per thread: a long row read by a small workgroup is a chain of
        // dependent loads. From the row length alone, so every batch reduces a row alike.
        uint32_t threads = 64;
        while (threads < 512 && threads * 8 <= uint32_t(x.cols))
            threads *= 2;
        dispatch("rms_norm", {&x, &weight, &out}, kWrites2, pc, uint32_t(x.rows), {threads, 1, 1});
    }

    // Wider than a verification batch: the tiled matmul takes it, which has no fused norm,
    // rotation or gate (those ops then run on their own: a weight read once per 64 columns is
    // worth the extra dispatches).
    bool wide(const Tensor& x) const { return tiled_ && x.rows > kVerificationColumns; }

    // The matmul shader norms its input as it reads it (NORMED): the norm is left pending where
    // it can (f32 weight, 16-byte aligned like x).
    MatmulInput normed(const Tensor& x, const Tensor& weight, float eps,
                       const Tensor& out) override {
        if (!fuse_norm_ || wide(x) || weight.type != GgmlType::kF32 || weight.offset % 16 != 0 ||
            x.offset % 16 != 0 || x.cols % 32 != 0)
            return Backend::normed(x, weight, eps, out);
        MatmulInput in(x);
        in.norm = weight;
        in.eps = eps;
        in.scratch = out;
        return in;
    }

    void matmul(const Tensor& w, const MatmulInput& x, const Tensor& out,
                Accumulate accumulate) override {
        matmul_shader(w, nullptr, nullptr, x, out, accumulate);
    }

    // Rotated as the products are written (the shader's ROPE variant), where pairs of rows never
    // straddle a group: heads of an even size.
    void matmul_rope(const Tensor& w, const MatmulInput& x, const Tensor& out,
                     const Rope& rope) override {
        if (!fuse_rope_ || wide(x.x) || rope.head_dim % 2 != 0 || vbuf(w).split())
            return Backend::matmul_rope(w, x, out, rope);
        matmul_shader(w, nullptr, &rope, x, out, Accumulate::kNo);
    }

    // One pass for both products of the feed-forward's gate (the shader's GATED variant), where
    // both matrices have one type and shape (mixed-type files take the three ops).
    void matmul_gated(Activation act, const Tensor& w_gate, const Tensor& w_up,
                      const MatmulInput& x, const Tensor& out, const Tensor& up) override {
        if (wide(x.x) || w_up.type != w_gate.type || w_up.cols != w_gate.cols ||
            w_up.rows != w_gate.rows || vbuf(w_gate).split() || vbuf(w_up).split())
            return Backend::matmul_gated(act, w_gate, w_up, x, out, up);
        matmul_shader(w_gate, &w_up, nullptr, x, out, Accumulate::kNo, act);
    }

    // out = w·x, or with `gated_by` out = act(w·x) * (gated_by·x), or rotated by `rope`; x
    // normed on the way where it carries a norm.
    void matmul_shader(const Tensor& w, const Tensor* gated_by, const Rope* rope,
                       const MatmulInput& input, const Tensor& out, Accumulate accumulate,
                       Activation act = Activation::kSilu) {
        if (vbuf(w).split()) {
            // Each part's rows are outputs of their own: the part's product written from its
            // first row on, rows out.cols apart as before (plain products only: see the callers).
            for (const auto& part : vbuf(w).parts()) {
                Tensor o = out;
                o.offset += size_t(part.first_row) * sizeof(float);
                matmul_shader({part.buffer.get(), 0, w.type, w.cols, part.rows}, nullptr, nullptr,
                              input, o, accumulate);
            }
            return;
        }
        const Tensor& x = input.x;
        const Tensor* norm = input.has_norm() ? &input.norm : nullptr;
        // The shader reads x in 16-byte vectors: every activation tensor starts a row of a
        // buffer, so this holds for the model's inputs.
        if (x.offset % 16 != 0 || w.cols % 32 != 0)
            return fail(Unsupported("Vulkan matmul needs 16-byte aligned inputs of whole blocks"));
        // Threads per row: four per block up to the workgroup, from the row length alone
        // (never from n), so a row is reduced the same way in every batch.
        uint32_t per_row = 4;
        while (per_row < kMatmulThreads && per_row * 2 <= uint32_t(w.cols / 32) * 4)
            per_row *= 2;
        // Sums over subgroups where a row's threads fill whole ones (also from the row length
        // and the device alone), in pipelines that require that size where it is pinned.
        const uint32_t subgroup = per_row >= phys_.fixed_subgroup ? phys_.fixed_subgroup : 0;
        // Batches wider than the verification batch, plain products only: the tiled shader,
        // which reads each weight once per 64 columns (its sums are in another order).
        if (wide(x) && gated_by == nullptr && rope == nullptr && norm == nullptr) {
            static_assert(shared::kMatmulTileThreads == 4 * shared::kMatmulTile &&
                          shared::kMatmulTileThreads ==
                              shared::kMatmulTileStep * shared::kMatmulTileStep);
            const uint32_t row_tiles =
                uint32_t((w.rows + shared::kMatmulTile - 1) / shared::kMatmulTile);
            const uint32_t col_tiles =
                uint32_t((x.rows + shared::kMatmulTile - 1) / shared::kMatmulTile);
            PushConstants pc;
            pc.u[0] = uint32_t(w.cols);
            pc.u[1] = uint32_t(w.rows);
            pc.u[2] = uint32_t(x.rows);
            pc.u[3] = uint32_t(out.cols);
            pc.u[4] = accumulate == Accumulate::kYes ? 1 : 0;
            pc.u[5] = row_tiles;
            return dispatch_typed("matmul_tiled", w.type, {&w, &x, &out}, kWrites2, pc,
                                  row_tiles * col_tiles, {shared::kMatmulTileThreads});
        }
        // Otherwise batches wider than the shader's column limit go in slices; each column's
        // result is computed the same way in any slice, so this keeps batch invariance.
        for (int64_t c0 = 0; c0 < x.rows; c0 += kMaxBatchColumns) {
            const int64_t n = std::min<int64_t>(kMaxBatchColumns, x.rows - c0);
            const Tensor xs = x.row_range(c0, n), os = out.row_range(c0, n);
            PushConstants pc;
            pc.u[0] = uint32_t(w.cols);
            pc.u[1] = uint32_t(w.rows);
            pc.u[2] = uint32_t(n);
            pc.u[3] = uint32_t(out.cols);
            pc.u[4] = accumulate == Accumulate::kYes ? 1 : 0;
            pc.f[0] = input.eps;
            Tensor positions{};
            if (rope != nullptr) {
                positions = rope->positions;  // this slice's columns
                positions.offset += size_t(c0) * sizeof(int32_t);
                positions.cols = n;
                pc.u[5] = uint32_t(rope->head_dim);
                pc.u[6] = uint32_t(rope->n_rot);
            }
            uint32_t bucket = 1;  // pipelines exist for 1, 2, 4, 8 and 16 columns only
            while (bucket < uint32_t(n))
                bucket *= 2;
            // More rows per group for more columns: each x value loaded serves more rows; two
            // for one or two columns, so that small matrices still spread over many groups.
            // Gated, a group loads its rows of both matrices: half as many rows, as many loads.
            // Four at 8 columns: on an H200 a verification forward of 8 (1.1B, Q8_0) took 3.3
            // ms with 4 rows per group against 4.0 ms with 8 and 3.3 ms with 2; at 16 columns
            // 4 rows were no faster than 8 (docs/benchmarks.md, the H200 runs).
            uint32_t rows_per_group = bucket <= 2 ? 2 : bucket <= 8 ? 4 : 8;
            if (gated_by != nullptr) rows_per_group /= 2;
            const uint32_t rows_per_workgroup = rows_per_group * (kMatmulThreads / per_row);
            const Tensor* third = rope != nullptr ? &positions : gated_by;
            const Tensor* table = rope != nullptr ? &rope->table : nullptr;
            dispatch_typed("matmul", w.type, {&w, &xs, &os, third, norm, table}, kWrites2, pc,
                           uint32_t((w.rows + rows_per_workgroup - 1) / rows_per_workgroup),
                           {kMatmulThreads, rows_per_group, bucket, per_row, subgroup,
                            gated_by != nullptr ? 1u + uint32_t(act) : 0u,
                            norm != nullptr ? 1u : 0u, rope != nullptr ? 1u : 0u},
                           phys_.pin_subgroup ? subgroup : 0);
        }
    }

    void rope(const Tensor& x, const Tensor& positions, const Tensor& table, int head_dim,
              int n_rot) override {
        PushConstants pc;
        pc.u[0] = uint32_t(x.cols);
        pc.u[1] = uint32_t(x.rows);
        pc.u[2] = uint32_t(head_dim);
        pc.u[3] = uint32_t(n_rot);
        const uint64_t pairs = uint64_t(x.rows) * uint64_t(x.cols / head_dim) * uint64_t(n_rot / 2);
        dispatch("rope", {&x, &positions, &table}, kWrites0, pc, uint32_t((pairs + 63) / 64),
                 {64, 1, 1});
    }

    void copy(const Tensor& src, const Tensor& dst) override {
        if (dst.type != GgmlType::kF32)
            return fail(Unsupported("the Vulkan backend keeps KV caches in F32"));
        elementwise(2, src, src, dst);
    }

    void attention(const Attention& a) override {
        constexpr uint32_t kWg = 128;
        if (a.head_dim > int(2 * kWg))
            return fail(Unsupported("the Vulkan attention shader supports head sizes up to 256"));
        if (a.k.type != GgmlType::kF32 || a.v.type != GgmlType::kF32)
            return fail(Unsupported("the Vulkan backend keeps KV caches in F32"));
        PushConstants pc;
        pc.u[0] = uint32_t(a.n_head);
        pc.u[1] = uint32_t(a.n_head_kv);
        pc.u[2] = uint32_t(a.head_dim);
        pc.u[3] = uint32_t(a.pos0);
        pc.u[4] = uint32_t(a.q.rows);
        pc.u[5] = uint32_t(a.n_keys);
        pc.u[6] = uint32_t(a.window);
        pc.f[0] = a.scale;
        pc.f[1] = a.soft_cap;
        dispatch("attention", {&a.q, &a.k, &a.v, &a.out}, kWrites3, pc,
                 uint32_t(a.q.rows * a.n_head), {kWg, 1, 1});
    }

    void gated_mul(Activation act, const Tensor& gate, const Tensor& up,
                   const Tensor& out) override {
        elementwise(1, gate, up, out, uint32_t(act));
    }

    void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                    const Tensor& out) override {
        PushConstants pc;
        pc.u[0] = uint32_t(x.cols);
        pc.u[1] = uint32_t(x.rows);
        pc.f[0] = eps;
        dispatch("layer_norm", {&x, &weight, &bias, &out}, kWrites3, pc, uint32_t(x.rows),
                 {256, 1, 1});
    }

    void activate(Activation act, const Tensor& x, const Tensor& out) override {
        elementwise(3, x, x, out, uint32_t(act));
    }

    void im2col(const Tensor& x, const Convolution& conv, const Tensor& out) override {
        PushConstants pc;
        const uint64_t n = uint64_t(out.cols) * uint64_t(out.rows);
        pc.u[0] = uint32_t(n);
        pc.u[1] = uint32_t(out.cols);
        pc.u[2] = uint32_t(x.cols);
        pc.u[3] = uint32_t(x.rows);
        pc.u[4] = uint32_t(conv.stride);
        pc.u[5] = uint32_t(conv.kernel);
        pc.u[6] = uint32_t(conv.padding);
        dispatch("im2col", {&x, &out}, kWrites1, pc, uint32_t((n + 255) / 256), {256, 1, 1});
    }

    void expand_columns(const Tensor& src, const Tensor& ids, float fill,
                        const Tensor& out) override {
        PushConstants pc;
        const uint64_t n = uint64_t(out.cols) * uint64_t(out.rows);
        pc.u[0] = uint32_t(n);
        pc.u[1] = uint32_t(out.cols);
        pc.u[2] = uint32_t(src.cols);
        pc.f[0] = fill;
        dispatch("expand_columns", {&src, &ids, &out}, kWrites2, pc, uint32_t((n + 255) / 256),
                 {256, 1, 1});
    }

    void scale(const Tensor& x, float factor) override { elementwise(5, x, x, x, 0, factor); }
    void soft_cap(const Tensor& x, float cap) override { elementwise(6, x, x, x, 0, cap); }
    void round_to_half(const Tensor& x) override { elementwise(7, x, x, x); }

    void add_bias(const Tensor& x, const Tensor& bias) override {
        // b[i % period]: one row repeats, a whole tensor is read once.
        elementwise(4, x, bias, x, uint32_t(bias.rows > 1 ? x.cols * x.rows : x.cols));
    }

    void verify(const VerifyArgs& a) override {
        const auto V = uint32_t(a.target.cols);
        if (V > det::kMaxVocab)
            return fail(Unsupported("vocabularies above " + std::to_string(det::kMaxVocab) +
                                    " tokens are not supported on the device"));
        const bool greedy = a.sampling.greedy();
        const auto gamma = uint32_t(a.gamma), batch = uint32_t(a.batch);
        const uint32_t rows_per_seq = shared::verify_rows_per_sequence(gamma, greedy);
        const uint32_t rows = batch * rows_per_seq;
        const uint32_t tiles = shared::verify_tiles(V);
        const size_t words = shared::verify_scratch_words(rows, tiles, batch);
        if (!verify_scratch_ || verify_scratch_->size() < words * 4) {
            // A replaced buffer is buried until the device is idle, so recorded passes keep it.
            verify_scratch_.reset();
            if (Status s = make_buffer(words * 4, false, &verify_scratch_); !s.ok())
                return fail(std::move(s));
        }
        Tensor scratch;
        scratch.buffer = verify_scratch_.get();
        scratch.cols = int64_t(words);
        scratch.rows = 1;

        PushConstants pc;
        pc.u[0] = V;
        pc.u[1] = batch;
        pc.u[2] = gamma;
        pc.u[3] = rows_per_seq;
        pc.u[4] = tiles;
        pc.u[5] = a.sampling.top_k > 0 ? uint32_t(a.sampling.top_k) : 0;
        pc.u[6] = uint32_t(a.stream);
        pc.u[7] = a.step;
        pc.u[8] = a.row_offset;
        pc.u[9] = uint32_t(a.sampling.seed);
        pc.u[10] = uint32_t(a.sampling.seed >> 32);
        const bool filtered = a.sampling.filtered(int(V));
        pc.u[11] = (greedy ? shared::kVerifyFlagGreedy : 0u) |
                   (a.result.buffer ? shared::kVerifyFlagWriteResult : 0u) |
                   (a.token.buffer ? shared::kVerifyFlagWriteToken : 0u) |
                   (filtered ? shared::kVerifyFlagFiltered : 0u);
        pc.f[0] = a.sampling.inv_temperature();
        pc.f[1] = a.sampling.nucleus();
        const Bound bound = {&a.target, &a.draft, &a.drafts, &scratch, &a.result, &a.token};
        auto pass = [&](uint32_t mode, uint32_t groups) {
            dispatch("decode", bound, kWritesAll, pc, groups, {shared::kDetLanes, mode, 0});
        };
        pass(shared::kVerifyPassTileMax, rows * tiles);
        if (greedy) return pass(shared::kVerifyPassAccept, batch);
        pass(shared::kVerifyPassRowMax, rows);
        if (!filtered) pass(shared::kVerifyPassTileSum, rows * tiles);
        pass(shared::kVerifyPassRowNorm, rows);
        pass(shared::kVerifyPassAccept, batch);
        pass(shared::kVerifyPassRace, batch * tiles);
        pass(shared::kVerifyPassFinish, batch);
    }

    // On the device, so a speculative Whisper step keeps its one wait
    // (backend/vulkan/shaders/mask_logits.comp).
    void mask_logits(const MaskArgs& a) override {
        const auto V = uint32_t(a.logits.cols);
        if (V > det::kMaxVocab)
            return fail(Unsupported("vocabularies above " + std::to_string(det::kMaxVocab) +
                                    " tokens are not supported on the device"));
        if (!mask_words_) {
            if (Status s =
                    make_buffer(shared::kMaskProgramWords * sizeof(int32_t), false, &mask_words_);
                !s.ok())
                return fail(std::move(s));
        }
        Tensor words;
        words.buffer = mask_words_.get();
        words.type = GgmlType::kI32;
        words.cols = shared::kMaskProgramWords;
        words.rows = 1;
        // Recorded in order: a dispatch before this upload still reads the words it was given.
        upload(words, program_words(a.program, a.state).data());
        PushConstants pc;
        pc.u[0] = V;
        pc.u[1] = uint32_t(a.first_row);
        pc.u[2] = a.log_sum_exp.buffer != nullptr ? 1u : 0u;
        dispatch("mask_logits", {&a.logits, &a.drafts, &words, &a.log_sum_exp}, kWrites0 | kWrites3,
                 pc, uint32_t(a.logits.rows), {shared::kDetLanes, 0, 0});
    }

    // The benchmark's multi-dispatch baseline (backend/vulkan/shaders/verify_baseline.comp): two
    // host waits, full probability rows in memory. Sampled verification only.
    Status verify_multi_dispatch(const VerifyArgs& a, std::vector<int32_t>* tokens) {
        const auto V = uint32_t(a.target.cols), g = uint32_t(a.gamma), B = uint32_t(a.batch);
        const size_t sizes[] = {
            size_t(B) * (g + 1) * V, size_t(B) * g * V, size_t(B) * V, size_t(B) * g, B, B};
        std::array<Tensor, 6> t;  // P, Q, residual, flags, n, tokens
        for (size_t i = 0; i < t.size(); ++i) {
            if (baseline_.size() <= i) baseline_.emplace_back();
            if (!baseline_[i] || baseline_[i]->size() < sizes[i] * 4) {
                baseline_[i].reset();
                SPECULA_TRY(make_buffer(std::max<size_t>(sizes[i], 1) * 4, false, &baseline_[i]));
            }
            t[i] = {baseline_[i].get(), 0, GgmlType::kF32, int64_t(sizes[i]), 1};
        }
        PushConstants pc;
        pc.u[0] = V;
        pc.u[1] = B;
        pc.u[2] = g;
        pc.f[0] = a.sampling.inv_temperature();
        auto pass = [&](uint32_t mode, Bound bound, uint32_t groups) {
            dispatch("verify_baseline", bound, kWritesAll, pc, groups, {256, mode, 0});
        };
        pass(0, {&a.target, &t[0]}, B * (g + 1));
        pass(0, {&a.draft, &t[1]}, B * g);
        pass(1, {&t[0], &t[1], &a.drafts, &t[3]}, B);
        std::vector<uint32_t> flags(size_t(B) * g), n(B);
        SPECULA_TRY(download(t[3], flags.data()));  // the acceptances go to the host
        for (uint32_t b = 0; b < B; ++b)
            while (n[b] < g && flags[b * g + n[b]] != 0)
                ++n[b];
        upload(t[4], n.data());
        pass(2, {&t[0], &t[1], &t[4], &t[2]}, B);
        pass(3, {nullptr, nullptr, nullptr, &t[2]}, B);
        pass(4, {nullptr, nullptr, nullptr, &t[2], &t[5]}, B);
        tokens->resize(B);
        return download(t[5], tokens->data());
    }

  private:
    Status usable() const {
        if (lost_)
            return {SPECULA_ERR_DEVICE_LOST, "the Vulkan device was lost; create a new backend"};
        return Status::Ok();
    }

    void fail(Status s) {
        if (pending_.ok()) pending_ = std::move(s);
    }

    // Whether commands may be recorded: none after an error (the next flush reports it) or a
    // loss (the command buffer is never begun again).
    bool recording() const { return pending_.ok() && !lost_; }

    Status make_buffer(size_t bytes, bool host_visible, std::unique_ptr<VulkanBuffer>* out) {
        auto b = std::make_unique<VulkanBuffer>(device_, bytes);
        SPECULA_TRY(b->create(host_visible));
        *out = std::move(b);
        return Status::Ok();
    }

    void read_marks() {
        for (uint32_t slot = 0; slot < uint32_t(kTimeSlots); ++slot)
            if (marked_ & (1u << slot))
                vk::vkGetQueryPoolResults(device_->handle, queries_, slot, 1, sizeof(uint64_t),
                                          &ticks_[slot], sizeof(uint64_t),
                                          VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    }

    Status begin() {
        staging_used_ = 0;
        n_recorded_ = 0;
        read_since_barrier_.clear();
        written_since_barrier_.clear();
        SPECULA_TRY(vk_check(vk::vkResetCommandBuffer(cmd_, 0), "vkResetCommandBuffer"));
        VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
        bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
        SPECULA_TRY(vk_check(vk::vkBeginCommandBuffer(cmd_, &bi), "vkBeginCommandBuffer"));
        marked_ = 0;
        if (queries_) vk::vkCmdResetQueryPool(cmd_, queries_, 0, kTimeSlots);
        if (profile_) {
            vk::vkCmdResetQueryPool(cmd_, profile_, 0, kProfileQueries);
            profile_names_.assign(1, "");
            vk::vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, profile_, 0);
            recording_since_ = std::chrono::steady_clock::now();
        }
        return Status::Ok();
    }

    // Everything recorded before (shaders or copies) happens before, and is visible to,
    // everything after.
    void barrier() {
        constexpr VkPipelineStageFlags stages =
            VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
        VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
        mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
        mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                           VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
        vk::vkCmdPipelineBarrier(cmd_, stages, stages, 0, 1, &mb, 0, nullptr, 0, nullptr);
        read_since_barrier_.clear();
        written_since_barrier_.clear();
        ++n_recorded_;
    }
    // Before a copy: the dispatches since the last barrier finish first.
    void settle() {
        if (!read_since_barrier_.empty() || !written_since_barrier_.empty()) barrier();
    }
    // A dispatch waits (barrier) only for those before it that it depends on: any that wrote a
    // buffer it binds, or read one it writes. Whole buffers, as the descriptors bind them, so
    // the synchronization validation of the tests sees the same hazards. Independent
    // dispatches (the q, k and v projections; gate and up) may then run together.
    void order_after_dependencies(const std::array<const VulkanBuffer*, kBindings>& bound,
                                  uint32_t writes) {
        auto holds = [](const std::vector<VkBuffer>& v, VkBuffer b) {
            return std::find(v.begin(), v.end(), b) != v.end();
        };
        bool depends = barrier_every_dispatch_;
        for (size_t i = 0; i < kBindings && !depends; ++i) {
            if (bound[i] == dummy_.get()) continue;
            const VkBuffer b = bound[i]->handle();
            depends = holds(written_since_barrier_, b) ||
                      ((writes >> i & 1u) != 0 && holds(read_since_barrier_, b));
        }
        if (depends) barrier();
        for (size_t i = 0; i < kBindings; ++i) {
            if (bound[i] == dummy_.get()) continue;
            auto& list = (writes >> i & 1u) != 0 ? written_since_barrier_ : read_since_barrier_;
            if (!holds(list, bound[i]->handle())) list.push_back(bound[i]->handle());
        }
    }

    // Specialization constants: 0 = workgroup size, 1..7 shader-specific (see the shader).
    static constexpr uint32_t kSpecConstants = 8;
    using Spec = std::array<uint32_t, kSpecConstants>;
    // required_subgroup > 0: the pipeline runs in full subgroups of that size (a pinned
    // size, PhysicalDevice::pin_subgroup).
    Status pipeline(const std::string& name, Spec spec_values, uint32_t required_subgroup,
                    VkPipeline* out) {
        std::string key = name;
        for (uint32_t v : spec_values) {
            key.push_back('/');
            key.append(std::to_string(v));
        }
        key.append("/required " + std::to_string(required_subgroup));
        if (auto it = pipelines_.find(key); it != pipelines_.end()) {
            *out = it->second;
            return Status::Ok();
        }
        const EmbeddedShader* shader = nullptr;
        for (size_t i = 0; i < vulkan_shader_count; ++i)
            if (name == vulkan_shaders[i].name) shader = &vulkan_shaders[i];
        if (shader == nullptr) return {SPECULA_ERR_INTERNAL, "no embedded shader named " + name};
        VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
        mi.codeSize = shader->bytes;
        mi.pCode = shader->code;
        VkShaderModule module = VK_NULL_HANDLE;
        SPECULA_TRY(vk_check(vk::vkCreateShaderModule(device_->handle, &mi, nullptr, &module),
                             "vkCreateShaderModule"));
        std::array<VkSpecializationMapEntry, kSpecConstants> entries{};
        for (uint32_t i = 0; i < kSpecConstants; ++i)
            entries[i] = {i, uint32_t(i * sizeof(uint32_t)), sizeof(uint32_t)};
        const VkSpecializationInfo spec{kSpecConstants, entries.data(), sizeof spec_values,
                                        spec_values.data()};
        VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
        ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
        ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
        ci.stage.module = module;
        ci.stage.pName = "main";
        ci.stage.pSpecializationInfo = &spec;
        VkPipelineShaderStageRequiredSubgroupSizeCreateInfo required{
            VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO};
        if (required_subgroup > 0) {
            required.requiredSubgroupSize = required_subgroup;
            ci.stage.pNext = &required;
            ci.stage.flags = VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT;
        }
        ci.layout = layout_;
        const VkResult r =
            vk::vkCreateComputePipelines(device_->handle, cache_, 1, &ci, nullptr, out);
        vk::vkDestroyShaderModule(device_->handle, module, nullptr);
        SPECULA_TRY(vk_check(r, "creating the pipeline of " + name));
        pipelines_[key] = *out;
        return Status::Ok();
    }

    // Descriptor sets are made once per combination of buffers and kept: a forward binds the
    // same buffers every time (offsets travel in push constants), so recording it writes no
    // descriptors. Forgotten when buffers are destroyed, after a wait for the device.
    using BufferSet = std::array<VkBuffer, kBindings>;
    void forget_descriptor_sets() {
        for (VkDescriptorPool p : pools_)
            vk::vkResetDescriptorPool(device_->handle, p, 0);
        pool_index_ = 0;
        descriptor_sets_.clear();
    }
    Status descriptor_set(const std::array<const VulkanBuffer*, kBindings>& bound,
                          VkDescriptorSet* out) {
        BufferSet buffers{};
        for (size_t i = 0; i < kBindings; ++i)
            buffers[i] = bound[i]->handle();
        if (auto it = descriptor_sets_.find(buffers); it != descriptor_sets_.end()) {
            *out = it->second;
            return Status::Ok();
        }
        SPECULA_TRY(new_descriptor_set(out));
        std::array<VkDescriptorBufferInfo, kBindings> infos{};
        std::array<VkWriteDescriptorSet, kBindings> writes{};
        for (size_t i = 0; i < kBindings; ++i) {
            infos[i] = {buffers[i], 0,
                        std::min<VkDeviceSize>(bound[i]->capacity(),
                                               device_->limits.maxStorageBufferRange)};
            writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
            writes[i].dstSet = *out;
            writes[i].dstBinding = uint32_t(i);
            writes[i].descriptorCount = 1;
            writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
            writes[i].pBufferInfo = &infos[i];
        }
        vk::vkUpdateDescriptorSets(device_->handle, kBindings, writes.data(), 0, nullptr);
        descriptor_sets_[buffers] = *out;
        return Status::Ok();
    }
    Status new_descriptor_set(VkDescriptorSet* out) {
        for (;; ++pool_index_) {
            if (pool_index_ == pools_.size()) {
                const VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                kBindings * kSetsPerPool};
                VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
                pi.maxSets = kSetsPerPool;
                pi.poolSizeCount = 1;
                pi.pPoolSizes = &size;
                VkDescriptorPool pool = VK_NULL_HANDLE;
                SPECULA_TRY(
                    vk_check(vk::vkCreateDescriptorPool(device_->handle, &pi, nullptr, &pool),
                             "vkCreateDescriptorPool"));
                pools_.push_back(pool);
            }
            VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
            ai.descriptorPool = pools_[pool_index_];
            ai.descriptorSetCount = 1;
            ai.pSetLayouts = &set_layout_;
            const VkResult r = vk::vkAllocateDescriptorSets(device_->handle, &ai, out);
            if (r == VK_SUCCESS) return Status::Ok();
            if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL)
                return vk_check(r, "vkAllocateDescriptorSets");
        }
    }

    using Bound = std::array<const Tensor*, kBindings>;
    // Which bindings a shader writes (see order_after_dependencies).
    static constexpr uint32_t kWrites0 = 1u << 0, kWrites1 = 1u << 1, kWrites2 = 1u << 2,
                              kWrites3 = 1u << 3, kWritesAll = (1u << kBindings) - 1;
    void dispatch_typed(const char* op, GgmlType type, Bound t, uint32_t writes,
                        const PushConstants& pc, uint32_t groups, Spec spec,
                        uint32_t required_subgroup = 0) {
        const char* suffix = weight_suffix(type);
        if (suffix == nullptr)
            return fail(Unsupported(std::string(op) + " on weight type " + ggml_type_name(type)));
        // The types with 8/16-bit storage variants (backend/vulkan/shaders/CMakeLists.txt).
        const bool small =
            phys_.small_storage &&
            (type == GgmlType::kF16 || type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0);
        dispatch(std::string(op) + "_" + suffix + (small ? "_small" : ""), t, writes, pc, groups,
                 spec, required_subgroup);
    }

    // writes: a bit per binding the shader writes (the others it only reads). required_subgroup:
    // pipeline()'s.
    void dispatch(const std::string& shader, Bound tensors, uint32_t writes, PushConstants pc,
                  uint32_t groups, Spec spec, uint32_t required_subgroup = 0) {
        if (!recording() || groups == 0) return;
        VkPipeline p = VK_NULL_HANDLE;
        VkDescriptorSet set = VK_NULL_HANDLE;
        if (Status s = pipeline(shader, spec, required_subgroup, &p); !s.ok())
            return fail(std::move(s));
        std::array<const VulkanBuffer*, kBindings> bound{};
        for (size_t i = 0; i < kBindings; ++i) {
            const Tensor* t = tensors[i] && tensors[i]->buffer ? tensors[i] : nullptr;
            if (t && t->offset + t->bytes() > device_->limits.maxStorageBufferRange)
                return fail(Unsupported("a tensor lies beyond this device's storage-buffer range"));
            if (t && vbuf(*t).split())
                return fail(Unsupported(shader + " reads a weight held in parts"));
            bound[i] = t ? &vbuf(*t) : dummy_.get();
            pc.off[i] = t ? uint32_t(t->offset) : 0;
        }
        if (Status s = descriptor_set(bound, &set); !s.ok()) return fail(std::move(s));
        order_after_dependencies(bound, writes);
        vk::vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, p);
        vk::vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, layout_, 0, 1, &set, 0,
                                    nullptr);
        vk::vkCmdPushConstants(cmd_, layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof pc, &pc);
        // Large grids fold into y; shaders recover the linear index (group_index()).
        const uint32_t max_x = device_->limits.maxComputeWorkGroupCount[0];
        const uint32_t x = std::min(groups, max_x), y = (groups + x - 1) / x;
        vk::vkCmdDispatch(cmd_, x, y, 1);
        ++n_recorded_;
        if (profile_ && profile_names_.size() < kProfileQueries) {
            vk::vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, profile_,
                                    uint32_t(profile_names_.size()));
            profile_names_.push_back(shader);
        }
    }

    // SPECULA_VULKAN_PROFILE=1: device time per shader (from the timestamp after the previous
    // dispatch to the one after this; a dispatch that runs beside the one before it, with no
    // barrier between, shows only the time it adds) and host time spent recording and
    // waiting, summed over the backend's life and printed to stderr when it is destroyed.
    static constexpr uint32_t kProfileQueries = 4096;
    struct ProfileTotals {
        double record_s = 0, wait_s = 0, device_s = 0;
        uint64_t submissions = 0;
    };
    static double seconds(std::chrono::steady_clock::duration d) {
        return std::chrono::duration<double>(d).count();
    }
    void read_profile(std::chrono::steady_clock::time_point submitted) {
        profile_host_.wait_s += seconds(std::chrono::steady_clock::now() - submitted);
        ++profile_host_.submissions;
        std::vector<uint64_t> ticks(profile_names_.size());
        if (vk::vkGetQueryPoolResults(device_->handle, profile_, 0, uint32_t(ticks.size()),
                                      ticks.size() * sizeof(uint64_t), ticks.data(),
                                      sizeof(uint64_t), VK_QUERY_RESULT_64_BIT) != VK_SUCCESS)
            return;
        for (size_t i = 1; i < ticks.size(); ++i) {
            const double s = double(ticks[i] - ticks[i - 1]) * double(period_ns_) * 1e-9;
            auto& [count, total] = profile_by_shader_[profile_names_[i]];
            ++count;
            total += s;
            profile_host_.device_s += s;
        }
    }
    void print_profile() const {
        std::vector<std::pair<std::string, std::pair<uint64_t, double>>> rows(
            profile_by_shader_.begin(), profile_by_shader_.end());
        std::sort(rows.begin(), rows.end(),
                  [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
        std::fprintf(stderr,
                     "specula vulkan profile: %llu submissions, host recording %.3f ms, host "
                     "waiting %.3f ms, device (dispatches) %.3f ms\n",
                     static_cast<unsigned long long>(profile_host_.submissions),
                     profile_host_.record_s * 1e3, profile_host_.wait_s * 1e3,
                     profile_host_.device_s * 1e3);
        for (const auto& [name, v] : rows)
            std::fprintf(stderr, "  %-24s %8llu dispatches %10.3f ms %8.2f us each\n", name.c_str(),
                         static_cast<unsigned long long>(v.first), v.second * 1e3,
                         v.second * 1e6 / double(v.first));
    }

    // Ops of elementwise.comp; b_cols: b's row length where b is broadcast over a's rows.
    // backend/vulkan/shaders/elementwise.comp's op; u2: op 1's activation, op 4's columns of b; f0:
    // op 5's factor, op 6's cap.
    void elementwise(uint32_t op, const Tensor& a, const Tensor& b, const Tensor& out,
                     uint32_t u2 = 0, float f0 = 0.0f) {
        PushConstants pc;
        const uint64_t n = uint64_t(a.cols) * uint64_t(a.rows);
        pc.u[0] = uint32_t(n);
        pc.u[1] = op;
        pc.u[2] = u2;
        pc.f[0] = f0;
        dispatch("elementwise", {&a, &b, &out}, kWrites2, pc, uint32_t((n + 255) / 256),
                 {256, 1, 1});
    }

    PhysicalDevice phys_;
    specula_device_info info_{};
    std::shared_ptr<Device> device_;
    VkQueue queue_ = VK_NULL_HANDLE;
    VkCommandPool pool_ = VK_NULL_HANDLE;
    VkCommandBuffer cmd_ = VK_NULL_HANDLE;
    VkFence fence_ = VK_NULL_HANDLE;
    VkQueryPool queries_ = VK_NULL_HANDLE;    // null when the queue has no timestamps
    VkQueryPool profile_ = VK_NULL_HANDLE;    // the profile option only
    std::vector<std::string> profile_names_;  // the shader behind each profile query
    std::map<std::string, std::pair<uint64_t, double>> profile_by_shader_;  // dispatches, seconds
    ProfileTotals profile_host_;
    std::chrono::steady_clock::time_point recording_since_;
    uint32_t marked_ = 0;  // slots written in the current command buffer
    std::array<uint64_t, kTimeSlots> ticks_{};
    float period_ns_ = 0;
    VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
    VkPipelineLayout layout_ = VK_NULL_HANDLE;
    VkPipelineCache cache_ = VK_NULL_HANDLE;
    std::map<std::string, VkPipeline> pipelines_;
    std::vector<VkDescriptorPool> pools_;
    size_t pool_index_ = 0;
    std::map<BufferSet, VkDescriptorSet> descriptor_sets_;
    std::unique_ptr<VulkanBuffer> staging_, readback_, dummy_, verify_scratch_, mask_words_;
    std::vector<std::unique_ptr<VulkanBuffer>> baseline_;
    size_t staging_used_ = 0;
    size_t n_recorded_ = 0;
    // Buffers bound by dispatches since the last barrier (see order_after_dependencies).
    std::vector<VkBuffer> read_since_barrier_, written_since_barrier_;
    bool barrier_every_dispatch_ = false;
    bool fuse_norm_ = true;
    bool tiled_ = true;  // the many-column matmul (the tiled option forces)
    bool fuse_rope_ = true;
    size_t max_range_ = SIZE_MAX;  // the max_binding_bytes option
    Status pending_;
    bool lost_ = false;
    uint64_t host_waits_ = 0;
};

}  // namespace

uint32_t vulkan_matmul_subgroup(const Backend& vulkan, bool* pinned) {
    const auto* backend = dynamic_cast<const VulkanBackend*>(&vulkan);
    if (pinned != nullptr) *pinned = backend != nullptr && backend->subgroup_pinned();
    return backend != nullptr ? backend->matmul_subgroup() : 0;
}

bool vulkan_reads_small_storage(const Backend& vulkan) {
    const auto* backend = dynamic_cast<const VulkanBackend*>(&vulkan);
    return backend != nullptr && backend->reads_small_storage();
}

std::vector<specula_device_info> enumerate_vulkan_devices() {
    std::vector<specula_device_info> out;
    for (const auto& d : physical_devices())
        out.push_back(d.info);
    return out;
}

Status create_vulkan_backend(const specula_backend_params& params, std::unique_ptr<Backend>* out) {
    const Instance* inst = nullptr;
    SPECULA_TRY(instance(&inst));
    const specula_backend_options options = resolve_options(SPECULA_BACKEND_VULKAN, params.options);
    const auto devices = physical_devices(options);
    if (devices.empty())
        return {SPECULA_ERR_NO_DEVICE, "no Vulkan 1.1 device with a compute queue was found"};
    std::vector<specula_device_info> infos;
    for (const auto& d : devices)
        infos.push_back(d.info);
    size_t chosen = 0;
    SPECULA_TRY(choose_device(infos, params, "Vulkan", &chosen));
    auto backend = std::make_unique<VulkanBackend>();
    SPECULA_TRY(backend->init(devices[chosen], options));
    *out = std::move(backend);
    return Status::Ok();
}

Status vulkan_verify_multi_dispatch(Backend& vulkan, const VerifyArgs& args,
                                    std::vector<int32_t>* tokens) {
    auto* backend = dynamic_cast<VulkanBackend*>(&vulkan);
    if (backend == nullptr) return InvalidArgument("not a Vulkan backend");
    return backend->verify_multi_dispatch(args, tokens);
}

uint64_t vulkan_validation_error_count() {
    return g_validation_errors.load();
}

bool vulkan_validation_enabled() {
    const Instance* inst = nullptr;
    return instance(&inst).ok() && inst->validation;
}

}  // namespace specula
