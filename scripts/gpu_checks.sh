#!/usr/bin/env bash
# The GPU checks behind docs/benchmarks.md, in one go (at most 8 minutes), on a machine with a
# CUDA GPU, torch and creditaudit's dependencies (creditaudit itself is read from src/; no
# network: nothing is installed here — carry missing wheels and install them first):
#
#   1. tests/test_cuda.py (CUDA graphs: the captured step against the eager stacked step,
#      captured runs recorded, resumed and diverged; stacked runs and data on the GPU) and
#      tests/test_stacked.py;
#   2. eager vs captured vs stacked, per rule, in the real Trainer on the paper scale's data
#      path (random CIFAR-10-shaped images through the CIFAR loader, crop + flip on the GPU),
#      and per step (benchmarks/bench_stacked.py);
#   3. how far a step is from the GPU's peak (benchmarks/bench_gpu_peak.py, short);
#   4. one paper-scale epoch through Trainer with the defaults (captured, data on the GPU)
#      for BP and DFA (benchmarks/bench_gpu.py --skip-steps);
#   5. a small sweep trained alone and with --stack 4 on the GPU; its run records (no
#      checkpoints) go to $OUT/records.tar.gz so a later session can compare them.
#
# Every part has its own time limit, so one that hangs does not cost the others; outputs
# go to $OUT (default gpu_out/), the summary to $OUT/report.txt.
#
#   bash scripts/gpu_checks.sh
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH="src:benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
REPORT="$OUT/report.txt"
: > "$REPORT"
part() { echo "== $1 (limit $2 s) $(date -u +%H:%M:%S)" | tee -a "$REPORT"; }

part "machine" 10
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$REPORT"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
    | tee -a "$REPORT"
# A lent machine brings torch but not necessarily the rest (one lacked tomli-w, and four CUDA
# run tests failed on the import): say which before the tests do.
$PY - <<'PY' | tee -a "$REPORT"
import importlib.util
needed = ["numpy", "matplotlib", "tqdm", "markdown_it", "tomli_w", "mnist1d", "pytest"]
missing = [name for name in needed if importlib.util.find_spec(name) is None]
print("missing modules: " + ", ".join(missing) + " (install their wheels first)"
      if missing else "creditaudit's dependencies: all importable")
PY

part "tests: CUDA, captured and stacked steps" 120
timeout 120 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_stacked.py \
    2>&1 | tail -n 40 | tee "$OUT/tests.txt" | tail -n 15 | tee -a "$REPORT"

part "eager vs captured vs stacked (bench_stacked.py)" 150
timeout 150 $PY benchmarks/bench_stacked.py --device cuda --data cifar --methods bp dfa \
    --runs 4 8 --rounds 3 --steps 30 --out-json "$OUT/bench_stacked.json" \
    2>&1 | tee "$OUT/bench_stacked.txt" | grep -E "^\||load|Error" | tee -a "$REPORT"

part "peak (bench_gpu_peak.py, short)" 40
timeout 40 $PY benchmarks/bench_gpu_peak.py --repeats 3 --steps 30 --runs 8 --skip-compile \
    --skip-processes 2>&1 | tee "$OUT/bench_gpu_peak.txt" | grep -E "^\||FLOP" \
    | tee -a "$REPORT"

part "paper-scale epochs through Trainer (bench_gpu.py --skip-steps)" 70
timeout 70 $PY benchmarks/bench_gpu.py --skip-steps --epoch-methods bp dfa \
    --out "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench_gpu.txt" | tail -n 8 | tee -a "$REPORT"

part "a sweep alone and with --stack 4 (records in records.tar.gz)" 90
SWEEP_DIR=$(mktemp -d)
cat > "$SWEEP_DIR/sweep.toml" <<'TOML'
[base.data]
n_train = 5000
n_test = 2000
[base.optim]
epochs = 2
[base.diagnostics]
rho_samples = 256
rho_directions = 8
null_draws = 4
[grid]
"method.name" = ["bp", "dfa"]
"run.seed" = [1, 2, 3, 4]
TOML
for mode in alone stacked; do
    stack=1; [ "$mode" = stacked ] && stack=4
    started=$SECONDS
    timeout 45 $PY -m creditaudit sweep "$SWEEP_DIR/sweep.toml" --device cuda --workers 0 \
        --stack $stack --out "$SWEEP_DIR/$mode" -q > "$OUT/sweep_$mode.txt" 2>&1
    echo "sweep $mode (--stack $stack): exit $?, $((SECONDS - started)) s" | tee -a "$REPORT"
done
(cd "$SWEEP_DIR" && find alone stacked -name record.json -o -name config.toml \
    -o -name sweep_summary.json | tar czf - -T -) > "$OUT/records.tar.gz"
rm -rf "$SWEEP_DIR"
part "done" 0
