#!/bin/sh
# Wheels tools/gpu_check.sh installs on the GPU machine (Python 3.12, no network; it already has
# torch, transformers, safetensors, tokenizers, numpy, einops, ninja, nvidia-ml-py, matplotlib):
# FlashInfer (JIT: its FA2 kernels compile there with nvcc), its tvm-ffi, msgspec and snac. ~18 MB.
# flashinfer-cubin (precompiled kernels, 458 MB for 0.6.13) is over the 64 MiB a call may carry.
set -e
cd "$(dirname "$0")/.."
mkdir -p .git/info .whl
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
for spec in "flashinfer-python==0.6.13" "apache-tvm-ffi==0.1.15.post2" "msgspec==0.23.0" "snac==1.2.1"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "$spec"
done
ls -la .whl
