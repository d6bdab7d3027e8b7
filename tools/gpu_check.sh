#!/bin/sh
# The GPU path checks, on the `device` tool's GPU machine (or any CUDA host):
#   here, once:   sh tools/gpu_wheels.sh      (wheels the GPU machine lacks -> .whl/, git-ignored)
#   there:        sh tools/gpu_check.sh       (run with carry [".whl"]; writes $OUT/*.json)
# That machine has no network and its own python3 with a CUDA torch (2.11 when last read), so
# nothing is installed from an index: the carried wheels go to /tmp/site, and the project runs
# from this tree (runtime/ as `mstar`, graphs/ as `mstar_graphs`) through PYTHONPATH.
# Then bench pi05 / bench orpheus on the GPU (BENCH=0 skips them). Exit 1 if a check failed.
cd "$(dirname "$0")/.."
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/mstar_src
ln -sfn "$PWD/runtime" /tmp/mstar_src/mstar
ln -sfn "$PWD/graphs" /tmp/mstar_src/mstar_graphs
ln -sfn "$PWD/mstar_ros" /tmp/mstar_src/mstar_ros
export PYTHONPATH=/tmp/site:/tmp/mstar_src
set +e
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, flashinfer; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), 'flashinfer', flashinfer.__version__)"
OUT_DIR="${OUT:-.}"
rc=0
python3 tools/gpu_check.py --device cuda --json "$OUT_DIR/gpu-check.json" || rc=$?
if [ "${BENCH:-1}" = 1 ]; then  # the throughput goals where batching pays: on the GPU, same run, same checkpoint
    python3 -m mstar_ros.cli bench pi05 --device cuda --robots 1,8 --seconds 8 \
        --json "$OUT_DIR/bench-pi05-cuda.json" --plot "$OUT_DIR/bench-pi05-cuda.png" || rc=$?
    python3 -m mstar_ros.cli bench orpheus --device cuda --concurrency 8 --requests 16 \
        --json "$OUT_DIR/bench-orpheus-cuda.json" --plot "$OUT_DIR/bench-orpheus-cuda.png" || rc=$?
fi
exit $rc
