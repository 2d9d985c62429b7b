#!/usr/bin/env bash
# The device path's checks on a machine with a CUDA GPU, in one go (issue 16):
#   tests        the CUDA-only tests: every algorithm and augment on the GPU with the data
#                resident (tests/test_device_audit.py), a GPU run repeated bit for bit, equal
#                to the CPU run up to float rounding, extended to the longer run, vmap equal
#                to sequential on the GPU (tests/runtime/test_vmap.py), CUDA's generators in a
#                checkpoint (tests/runtime/test_checkpoints.py);
#   executors    benchmarks/executors.py: sequential against vmap, seconds per round, on the
#                GPU, with 6,000 and 60,000 Fashion-MNIST training examples;
#   determinism  benchmarks/determinism.py through the real command line on the GPU: the
#                same run twice, and once killed with SIGKILL and resumed;
#   profile      (not in the default) where a 100-client round's time goes on the GPU, both
#                executors: cProfile's top functions by own time.
# Run from the repository root with fedshift importable (installed, or PYTHONPATH=src) and
# Fashion-MNIST in the cache (`fedshift data fetch fashion-mnist`; FEDSHIFT_CACHE may point
# at a copy). Logs go to $OUT (default gpu-check/).
#
#     bash benchmarks/gpu_check.sh
#     STEPS="tests profile" bash benchmarks/gpu_check.sh
set -u
OUT=${OUT:-gpu-check}
STEPS=${STEPS:-tests executors determinism}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
status=0
want() { [[ " $STEPS " == *" $1 "* ]]; }

"$PY" - <<'EOF' 2>&1 | tee "$OUT/env.log"
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version())
print("gpu", torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory >> 20,
      "MiB")
EOF

if want tests; then
    echo "== CUDA tests"
    timeout 200 "$PY" -m pytest -p no:cacheprovider -n "${TEST_WORKERS:-8}" -rs \
        tests/test_device_audit.py tests/runtime/test_vmap.py \
        tests/runtime/test_checkpoints.py::test_rng_state_restores_the_gpu_generators_too \
        2>&1 | tee "$OUT/tests.log" | tail -25
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if want executors; then
    echo "== executors (GPU)"
    for size in 6000 60000; do
        timeout 150 "$PY" benchmarks/executors.py --device cuda --clients "${CLIENTS:-10,100}" \
            --rounds 3 --train-size $size --json "$OUT/executors-$size.json" 2>&1 \
            | tee "$OUT/executors-$size.log" | tail -5
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
    done
fi

if want determinism; then
    echo "== determinism and kill/resume through the CLI (GPU)"
    timeout 150 "$PY" benchmarks/determinism.py device=cuda dataset.name=fashion-mnist \
        partition.name=dirichlet partition.clients=10 model.name=cnn train.rounds=40 \
        eval.every=5 2>&1 | tee "$OUT/determinism.log" | tail -8
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if want profile; then
    echo "== profile: 100 clients, both executors (GPU)"
    timeout 150 "$PY" -m cProfile -o "$OUT/executors.prof" benchmarks/executors.py \
        --device cuda --clients 100 --rounds 3 >/dev/null 2>&1 || status=1
    "$PY" -c "import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats('tottime').print_stats(30)" \
        "$OUT/executors.prof" 2>&1 | tee "$OUT/profile.txt" | grep -A32 "ncalls"
fi

echo "gpu_check: $([ $status = 0 ] && echo ALL OK || echo FAILURES, see $OUT)"
exit $status
