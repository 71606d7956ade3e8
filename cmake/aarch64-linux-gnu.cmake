# Cross build for 64-bit ARM Linux with Debian's crossbuild-essential-arm64 and the arm64
# packages of the dependencies (multiarch: libhwy-dev:arm64, libgtest-dev:arm64, ...).
# Tests run under qemu-user (qemu-user-static) through CMAKE_CROSSCOMPILING_EMULATOR.
#   cmake -S . -B build/aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Libraries and packages of the target architecture only; programs (glslc) of the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# The programs run against the arm64 multiarch libraries (libc6:arm64, which libhwy-dev:arm64
# brings) that they are linked with: "-L /usr/aarch64-linux-gnu" would pair the cross
# toolchain's ld.so with the multiarch libc.so.6, two glibc builds whose private interfaces
# differ (pthread_create then spins forever).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)
