#!/bin/sh
# The GPU path checks on a machine with an NVIDIA GPU (e.g. the `device` tool's):
#   sh tools/gpu_check.sh        -> $OUT/gpu-check.json (exit 1 if a check failed), then
#                                   bench pi05 / bench orpheus on the GPU (BENCH=0 skips them)
# A venv of its own (.venv-gpu): PyPI's torch==2.13.0 is the CUDA build, and FlashInfer
# comes from the `gpu` extra (flashinfer-python + flashinfer-cubin, precompiled kernels:
# the GPU host cannot download them at run time).
set -e
cd "$(dirname "$0")/.."
if [ ! -x .venv-gpu/bin/python ]; then
    python3 -m venv .venv-gpu
    .venv-gpu/bin/pip install -q --upgrade pip
    .venv-gpu/bin/pip install -q "torch==2.13.0"
    .venv-gpu/bin/pip install -q -e ".[gpu]"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
.venv-gpu/bin/python -c "import torch, flashinfer; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'flashinfer', flashinfer.__version__)"
OUT_DIR="${OUT:-.}"
rc=0
.venv-gpu/bin/python tools/gpu_check.py --device cuda --json "$OUT_DIR/gpu-check.json" || rc=$?
if [ "${BENCH:-1}" = 1 ]; then  # the throughput goals where batching pays: on the GPU, same run, same checkpoint
    .venv-gpu/bin/pip install -q -e ".[bench,audio]"
    .venv-gpu/bin/python -m mstar_ros.cli bench pi05 --device cuda --robots 1,8 --seconds 8 \
        --json "$OUT_DIR/bench-pi05-cuda.json" --plot "$OUT_DIR/bench-pi05-cuda.png" || rc=$?
    .venv-gpu/bin/python -m mstar_ros.cli bench orpheus --device cuda --concurrency 8 --requests 16 \
        --json "$OUT_DIR/bench-orpheus-cuda.json" --plot "$OUT_DIR/bench-orpheus-cuda.png" || rc=$?
fi
exit $rc
