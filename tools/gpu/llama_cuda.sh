#!/usr/bin/env bash
# llama.cpp's CUDA build of llama-bench for the lent H200, from the llama.cpp that
# llama-cpp-python's sdist vendors (the version of the CPU peer), and the decode bench with
# it as the llama.cpp peer (`python -m bench decode --llama-bench`) beside ours and mlx-lm.
#   here:  bash tools/gpu/llama_cuda.sh pack     -> .device/llama/llama.cpp.tgz (~9 MB)
#   there, carry [".device/llama"], after tools/gpu/unpack.sh's last parcel:
#          bash tools/gpu/llama_cuda.sh build    (~4 min on 16 cores)
#          (alone, or in the background during parcels: `setsid nohup ... &` survives the
#          call; beside the engine's first steps it starves their NVRTC compiles: a
#          generate printed nothing in 150 s, session 14)
#          bash tools/gpu/llama_cuda.sh bench [more decode bench arguments]
set -euo pipefail
version=0.3.36
src=/root/llama.cpp
case "${1:?usage: llama_cuda.sh pack|build|bench}" in
pack)
  out=$(git rev-parse --show-toplevel)/.device/llama
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-binary :all: --no-deps -d "$tmp" "llama-cpp-python==$version"
  tar -xzf "$tmp/llama_cpp_python-$version.tar.gz" -C "$tmp"
  mkdir -p "$out"
  # what a llama-bench build does not read: models, docs, tests, benches, the web UI
  tar -C "$tmp/llama_cpp_python-$version/vendor" --exclude=llama.cpp/models \
    --exclude=llama.cpp/docs --exclude=llama.cpp/tests --exclude=llama.cpp/benches \
    --exclude=llama.cpp/media --exclude='llama.cpp/tools/server/public*' \
    --exclude=llama.cpp/tools/ui -czf "$out/llama.cpp.tgz" llama.cpp
  rm -rf "$tmp"
  ls -la "$out"
  ;;
build)
  export PATH=/usr/local/cuda/bin:$PATH
  rm -rf "$src" && tar -xzf .device/llama/llama.cpp.tgz -C /root
  cmake -S "$src" -B "$src/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_CURL=OFF > /tmp/llama-cmake.log 2>&1 || { tail -20 /tmp/llama-cmake.log; exit 1; }
  cmake --build "$src/build" --target llama-bench -j16 > /tmp/llama-build.log 2>&1 ||
    { tail -30 /tmp/llama-build.log; exit 1; }
  "$src/build/bin/llama-bench" --help | head -3
  ;;
bench)
  shift
  export PYTHONPATH=/root/site:$PWD
  python3 -m bench decode --peers --runs 1 --steps 32 --contexts 128,512,1024,2048,8192 \
    --llama-bench "$src/build/bin/llama-bench" "$@"
  cp results/decode-*.json "${OUT:-/tmp}/"
  ;;
*)
  echo "usage: llama_cuda.sh pack|build|bench" >&2
  exit 2
  ;;
esac
