#!/usr/bin/env bash
# Installs every Debian package Strata's build, tests and tools need.
# Idempotent: packages already present are skipped by apt-get; the index is
# refreshed only when something is missing.
set -euo pipefail

BUILD_PKGS=(
  build-essential cmake ninja-build pkg-config git
  nlohmann-json3-dev libspdlog-dev libfmt-dev libyaml-cpp-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev libssl-dev libopenblas-dev libdnnl-dev ocl-icd-opencl-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev libibverbs-dev librdmacm-dev
  prometheus-cpp-dev libboost-dev
  liburing-dev libxxhash-dev libcurl4-openssl-dev libzstd-dev libnuma-dev
)
TEST_PKGS=(
  # clang + compiler-rt: libFuzzer target and sanitizer builds
  clang libclang-rt-14-dev
  # tokenizer/chat-template reference tests install npm packages
  nodejs npm
  # later issues: promtool, etcd, plots
  prometheus etcd-server etcd-client gnuplot-nox
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${BUILD_PKGS[@]}" "${TEST_PKGS[@]}"; do
  # nodejs/npm may come from outside Debian on some machines; accept any working node.
  if [ "$p" = nodejs ] && command -v node >/dev/null 2>&1; then continue; fi
  if [ "$p" = npm ] && command -v npm >/dev/null 2>&1; then continue; fi
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#BUILD_PKGS[@]} build and ${#TEST_PKGS[@]} test packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
# etcd's Debian package starts a daemon on 2379 under systemd; tests use other ports.
