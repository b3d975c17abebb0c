#!/usr/bin/env bash
# The GPU checks behind docs/benchmarks.md, in one go, on a machine with a CUDA GPU, torch and
# creditaudit's dependencies (creditaudit itself is read from src/): the CUDA tests, the
# conformance suite with a GPU present, the step cost of every rule in fp32 and bf16, and how
# far a small model's step is from the GPU's peak. Every part has its own time limit, so one
# that hangs does not cost the others; outputs go to $OUT (default gpu_out/).
#
#   bash scripts/gpu_checks.sh
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
# A lent machine brings torch but not necessarily the rest (one lacked tomli-w, and four CUDA
# run tests failed on the import): say which before the tests do.
python3 - <<'PY' | tee -a "$OUT/gpu.txt"
import importlib.util
needed = ["numpy", "matplotlib", "tqdm", "markdown_it", "tomli_w", "mnist1d", "pytest"]
missing = [name for name in needed if importlib.util.find_spec(name) is None]
print("missing modules: " + ", ".join(missing) + " (install their wheels first)"
      if missing else "creditaudit's dependencies: all importable")
PY
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_conformance.py \
    2>&1 | tail -n 40 | tee "$OUT/tests.txt"
timeout 150 python3 benchmarks/bench_gpu_peak.py --repeats 3 --steps 50 --runs 8 \
    2>&1 | tee "$OUT/bench_gpu_peak.txt"
timeout 80 python3 benchmarks/bench_gpu.py --skip-epochs --repeats 3 --steps 20 \
    2>&1 | tee "$OUT/bench_gpu.txt"
