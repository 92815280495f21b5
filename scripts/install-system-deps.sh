#!/usr/bin/env bash
# System packages the tests use from Debian: the ARM64 cross compiler and qemu (generated code runs
# under emulation), LLVM 19 (llvm-mca's ARM pipeline models: the ARM64 cycle estimate), PoCL
# (OpenCL on the CPU), Mesa lavapipe (Vulkan on the CPU), and for the Android build's own branch a
# JDK (javac: the AAR's classes.jar, jni.h) and Android's logcat header; Graphviz draws fuse's plan.svg.
# Installs only what is missing; needs root (or sudo).
set -euo pipefail
packages=(g++ g++-aarch64-linux-gnu qemu-user llvm-19 pocl-opencl-icd ocl-icd-libopencl1 mesa-vulkan-drivers libvulkan1
          default-jdk-headless android-liblog-dev graphviz)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
