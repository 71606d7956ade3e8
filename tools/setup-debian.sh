#!/usr/bin/env bash
# Installs what building and testing specula needs on Debian 12 (as root, or through sudo).
#   bash tools/setup-debian.sh           the native build
#   bash tools/setup-debian.sh aarch64   also the 64-bit ARM cross build and qemu-user to run it
#                                        (cmake/aarch64-linux-gnu.cmake; adds dpkg's arm64 arch)
#   bash tools/setup-debian.sh train     also what tools/train/run.sh trains the demo pair with
#   bash tools/setup-debian.sh train-asr also what tools/train/run_asr.sh trains the speech pair with
set -euo pipefail
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
packages=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-14-dev            # libFuzzer and sanitizer runtimes
  clang-format                        # the style check (.clang-format)
  libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev
  libcpp-httplib-dev                  # cpp-httplib: specula-server's HTTP
  libhwy-dev                          # Google Highway: portable SIMD for the cpu backend
  libpcre2-dev                        # PCRE2: the tokenizers' pre-split regexes
  libsamplerate0-dev                  # libsamplerate: speech input resampled to 16 kHz
  libkissfft-dev                      # KissFFT: the log-mel spectrogram of speech input
  libsndfile1-dev                     # libsndfile: FLAC, MP3 and Ogg speech input
  libwebrtc-audio-processing-dev      # WebRTC's voice activity detection: live transcription
  espeak-ng                           # the synthetic speech of the live transcription test
  python3 python3-numpy               # the NumPy reference
  python3-jinja2                      # Jinja2: the chat templates' oracle (tests/reference/chat_oracle.py)
  python3-pytest python3-venv python3-pip python3-setuptools python3-wheel  # the Python bindings' tests and install
  glslc libvulkan-dev                 # Vulkan shaders and headers (the loader is opened at run time)
  mesa-vulkan-drivers vulkan-validationlayers  # llvmpipe: a Vulkan device on the CPU; the Khronos validation layer
)
if [ "${1:-}" = aarch64 ]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $sudo dpkg --add-architecture arm64
    $sudo apt-get update -qq
  fi
  packages+=(crossbuild-essential-arm64 qemu-user-static libhwy-dev:arm64 libpcre2-dev:arm64 libsamplerate0-dev:arm64 libkissfft-dev:arm64 libsndfile1-dev:arm64 libwebrtc-audio-processing-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64)
fi
case "${1:-}" in
  train | train-asr)
    # PyTorch with OpenBLAS (without it PyTorch falls back to the reference BLAS: 6x slower);
    # the corpus is the Python documentation's sources.
    packages+=(python3-torch libopenblas0-pthread python3.11-doc) ;;&
  train-asr)
    # the word list, two more manuals' prose, the speech synthesizer, resampling
    packages+=(wamerican perl-doc postgresql-doc-15 espeak-ng sox) ;;
esac
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
