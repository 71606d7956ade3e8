# Writes OUTPUT: a C++ source holding each SPIR-V file in SPV_FILES as a
# word array, and a table `specula::vulkan_shaders` from shader name to code.
# Run with: cmake -DOUTPUT=... -DSPV_FILES=a.spv,b.spv -P embed_spirv.cmake
string(REPLACE "," ";" SPV_FILES "${SPV_FILES}")
set(body "")
set(table "")
foreach(spv IN LISTS SPV_FILES)
  get_filename_component(name ${spv} NAME_WE)
  file(READ ${spv} hex HEX)
  # SPIR-V is little-endian on disk: reverse the four bytes of each word.
  string(REGEX REPLACE "([0-9a-f][0-9a-f])([0-9a-f][0-9a-f])([0-9a-f][0-9a-f])([0-9a-f][0-9a-f])"
         "0x\\4\\3\\2\\1," words "${hex}")
  string(APPEND body "const uint32_t k_${name}[] = {${words}};\n")
  string(APPEND table "    {\"${name}\", k_${name}, sizeof(k_${name})},\n")
endforeach()
file(WRITE ${OUTPUT}.tmp "// Generated from backend/vulkan/shaders/*.comp by cmake/embed_spirv.cmake. Do not edit.
#include <cstddef>
#include <cstdint>

#include \"backend/vulkan/shaders.h\"

namespace specula {
namespace {
${body}}  // namespace

const EmbeddedShader vulkan_shaders[] = {
${table}};
const size_t vulkan_shader_count = sizeof(vulkan_shaders) / sizeof(vulkan_shaders[0]);

}  // namespace specula
")
file(COPY_FILE ${OUTPUT}.tmp ${OUTPUT} ONLY_IF_DIFFERENT)
