#!/usr/bin/env bash
# The GPU standing order in one script, for a lent GPU machine (one GPU, CuPy with NCCL,
# mpi4py on the machine's own MPI): the NCCL tests, topoplan bench over NCCL under that
# machine's mpiexec (one rank, and four ranks sharing the GPU), composed plans whose in-box
# steps are NCCL's own over sub-communicators (eight ranks sharing the GPU), and the NCCL
# model's table. Everything it prints also goes to $OUT/gpu_check.log ($OUT defaults to ./out).
#
#   bash scripts/gpu_check.sh            # from the repository root
#
# Each step has its own time limit, so one that hangs cannot eat the others' time.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
step() { echo; echo "== $1"; }
{
step "machine"
date -u
nvidia-smi -L
$PY - <<'PYEOF'
import cupy, torch
from cupy.cuda import nccl
from mpi4py import MPI
print("cupy", cupy.__version__, "nccl", nccl.get_version(), "torch", torch.__version__)
print("mpi4py library:", MPI.Get_library_version().splitlines()[0])
PYEOF
command -v mpiexec && mpiexec --version 2>&1 | head -2

step "NCCL and launcher tests"
timeout 300 $PY -m pytest -q -p no:cacheprovider tests/test_transports_nccl.py \
    tests/test_interop_nccl.py tests/test_mpirun.py \
    "tests/test_calibrate.py" -k "nccl or launcher or mpirun or flavour" 2>&1 | tail -25

step "bench, 1 rank, ring plan against ncclAllReduce"
timeout 120 $PY -m topoplan bench --transport nccl -n 1 --algorithm ring --baseline native \
    --sizes 1KiB:256MiB:8

step "bench, 4 ranks sharing the GPU (NCCL over sockets), auto against ncclAllReduce"
timeout 240 $PY -m topoplan bench --transport nccl --share-gpus -n 4 --algorithm auto \
    --baseline native --sizes 1KiB:64MiB:8

step "bench, 8 ranks sharing the GPU: composed (native NCCL steps over per-box sub-communicators) and nccl (one native step) against ncclAllReduce"
timeout 300 $PY -m topoplan bench --transport nccl --share-gpus -n 8 \
    --cluster topologies/targets/two_switch_4x2.yaml --algorithm composed --baseline native \
    --sizes 1KiB:64MiB:16
timeout 200 $PY -m topoplan bench --transport nccl --share-gpus -n 8 \
    --cluster topologies/targets/two_switch_4x2.yaml --algorithm nccl --baseline native \
    --sizes 1KiB:64MiB:16

step "bench, 4 ranks sharing the GPU: a ring on 2 channels (IR v4; over NCCL the channels run one after another) against ncclAllReduce"
timeout 60 $PY -m topoplan plan topologies/ddl_two_switch.yaml --algorithm ring --channels 2 \
    --size 16MiB -o "$OUT/ring_2ch.json" | tail -3
timeout 200 $PY -m topoplan bench --transport nccl --share-gpus -n 4 --plan "$OUT/ring_2ch.json" \
    --cluster topologies/ddl_two_switch.yaml --baseline native --sizes 1KiB:64MiB:8

step "the NCCL model against published nccl-tests figures"
timeout 60 $PY scripts/bench_nccl_model.py
} 2>&1 | tee "$OUT/gpu_check.log"
