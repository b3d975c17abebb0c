#!/usr/bin/env bash
# The GPU checks behind docs/benchmarks.md, in one go (about 6 minutes, at most 10, every part
# under its own time limit), on a machine with a CUDA GPU, torch and creditaudit's dependencies
# (creditaudit itself is read from src/; no network: nothing is installed here — carry
# missing wheels and install them first):
#
#   1. the CUDA tests (tests/test_cuda.py: CUDA graphs, the captured step against the eager
#      stacked step, captured runs recorded, resumed and diverged, data on the GPU) and
#      tests/test_stacked.py, one line per test in $LOGS/tests.txt;
#   2. ms per step of BP, FA, DFA, DRTP and frozen blocks in the real Trainer on the paper
#      scale's data path (random CIFAR-10-shaped images through the CIFAR loader, crop + flip
#      on the GPU): alone eager, alone captured, 4 and 8 stacked, eager and captured
#      (benchmarks/bench_stacked.py);
#   3. paper-scale epochs (50 000 images, per-epoch diagnostics on) through Trainer with the
#      defaults, for each rule of the audit table (benchmarks/bench_gpu.py --skip-steps);
#   4. a small sweep trained three ways — eager alone, captured alone, captured with
#      --stack 4 — whose run records (no checkpoints) go to $OUT/records.tar.gz, to compare
#      with each other and with the same sweep trained on a CPU
#      (scripts/compare_records.py);
#   5. how far a step is from the GPU's peak (benchmarks/bench_gpu_peak.py, short; last);
#   6. (only when PARTS names it) the whole test suite, where every run that does not name
#      its device trains on the GPU: one line per test in $LOGS/suite.txt.
#
# The summary goes to $OUT/report.txt (default gpu_out/), each part's output to $LOGS (default
# $OUT; another folder is also packed into $OUT/logs.tar.gz after every part). PARTS="1 4" runs
# only those parts (a rerun of what failed); SWEEP_DEVICE=cpu PARTS=4 trains part 4's sweep on
# the CPU (the reference its GPU records are compared with).
#
#   bash scripts/gpu_checks.sh
set -uo pipefail
OUT=${OUT:-gpu_out}
PARTS=${PARTS:-1 2 3 4 5}
SWEEP_DEVICE=${SWEEP_DEVICE:-cuda}
LOGS=${LOGS:-$OUT}
mkdir -p "$OUT" "$LOGS"
export PYTHONPATH="src:benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
REPORT="$OUT/report.txt"
: > "$REPORT"
part() {
    if [ "$LOGS" != "$OUT" ]; then tar czf "$OUT/logs.tar.gz" -C "$LOGS" .; fi
    echo "== $1 (limit $2 s) $(date -u +%H:%M:%S)" | tee -a "$REPORT"
}
wanted() { [[ " $PARTS " == *" $1 "* ]]; }

part "machine" 10
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$REPORT"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
    | tee -a "$REPORT"
git log -1 --format='revision %h %s' 2>/dev/null | tee -a "$REPORT"
# A lent machine brings torch but not necessarily the rest (one lacked tomli-w, and four CUDA
# run tests failed on the import): say which before the tests do.
$PY - <<'PY' | tee -a "$REPORT"
import importlib.util
needed = ["numpy", "matplotlib", "tqdm", "markdown_it", "tomli_w", "mnist1d", "pytest"]
missing = [name for name in needed if importlib.util.find_spec(name) is None]
print("missing modules: " + ", ".join(missing) + " (install their wheels first)"
      if missing else "creditaudit's dependencies: all importable")
PY

if wanted 1; then
    part "1. tests: CUDA, captured and stacked steps" 120
    workers=$($PY -c "import importlib.util as u; print(8 if u.find_spec('xdist') else 0)")
    timeout 120 $PY -m pytest -v -p no:cacheprovider -n "$workers" -W ignore::UserWarning \
        --tb=short tests/test_cuda.py tests/test_stacked.py > "$LOGS/tests.txt" 2>&1
    echo "pytest exit $?" | tee -a "$REPORT"
    grep -E "FAILED|ERROR" "$LOGS/tests.txt" | grep -v "^E " | head -n 20 | tee -a "$REPORT"
    tail -n 1 "$LOGS/tests.txt" | tee -a "$REPORT"
fi

if wanted 2; then
    part "2. ms per step in the Trainer: eager, captured, stacked (bench_stacked.py)" 130
    timeout 130 $PY benchmarks/bench_stacked.py --device cuda --data cifar --n-train 12800 \
        --methods bp fa dfa drtp frozen --runs 4 8 --rounds 3 --steps 30 \
        --out-json "$LOGS/bench_stacked.json" 2>&1 | tee "$LOGS/bench_stacked.txt" \
        | grep -E "^\||load|Error" | tee -a "$REPORT"
fi

if wanted 3; then
    part "3. paper-scale epochs through Trainer, the audit table's rules (bench_gpu.py)" 140
    timeout 140 $PY benchmarks/bench_gpu.py --skip-steps --precisions fp32 --epochs 2 \
        --epoch-methods bp fa dfa state-bridge credit-bridge frozen ep \
        --out "$LOGS/bench_gpu.json" 2>&1 | tee "$LOGS/bench_gpu.txt" | tail -n 9 \
        | tee -a "$REPORT"
fi

if wanted 4; then
    part "4. a sweep eager, captured and captured --stack 4 (records.tar.gz)" 150
    SWEEP_DIR=$(mktemp -d)
    for graphs in off auto; do
        mkdir -p "$SWEEP_DIR/$graphs"
        sed "s/GRAPHS/$graphs/" > "$SWEEP_DIR/$graphs/sweep.toml" <<'TOML'
[base.data]
n_train = 5000
n_test = 2000
[base.optim]
epochs = 2
[base.diagnostics]
rho_samples = 256
rho_directions = 8
null_draws = 4
[base.run]
cuda_graphs = "GRAPHS"
[grid]
"method.name" = ["bp", "dfa"]
"run.seed" = [1, 2, 3, 4]
TOML
    done
    for mode in eager captured stacked; do
        graphs=auto stack=1
        [ "$mode" = eager ] && graphs=off
        [ "$mode" = stacked ] && stack=4
        started=$SECONDS
        timeout 50 $PY -m creditaudit sweep "$SWEEP_DIR/$graphs/sweep.toml" \
            --device "$SWEEP_DEVICE" \
            --workers 0 --stack $stack --out "$SWEEP_DIR/$mode" -q > "$LOGS/sweep_$mode.txt" 2>&1
        echo "sweep $mode (cuda_graphs $graphs, --stack $stack): exit $?," \
            "$((SECONDS - started)) s" | tee -a "$REPORT"
        tail -n 3 "$LOGS/sweep_$mode.txt" | tee -a "$REPORT"
    done
    (cd "$SWEEP_DIR" && find eager captured stacked -name record.json -o -name config.toml \
        -o -name sweep_summary.json | tar czf - -T -) > "$OUT/records.tar.gz"
    rm -rf "$SWEEP_DIR"
fi
if wanted 5; then
    part "5. peak (bench_gpu_peak.py, short)" 40
    timeout 40 $PY benchmarks/bench_gpu_peak.py --repeats 3 --steps 30 --runs 8 \
        --skip-compile --skip-processes 2>&1 | tee "$LOGS/bench_gpu_peak.txt" \
        | grep -E "^\||FLOP|Error" | tee -a "$REPORT"
fi

if wanted 6; then
    part "6. the whole test suite on this machine (runs default to the GPU)" 200
    timeout 200 $PY -m pytest -v -p no:cacheprovider -n 14 -W ignore::UserWarning \
        --tb=line tests > "$LOGS/suite.txt" 2>&1
    echo "pytest exit $?" | tee -a "$REPORT"
    grep -E "^FAILED|^ERROR" "$LOGS/suite.txt" | head -n 40 | tee -a "$REPORT"
    tail -n 1 "$LOGS/suite.txt" | tee -a "$REPORT"
fi

part "done" 0
