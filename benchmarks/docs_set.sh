#!/usr/bin/env bash
# The measurements behind docs/benchmarks.md, in one go, on an otherwise idle machine.
#
#   bash benchmarks/docs_set.sh OUT_DIR [PYTHON] [--quick]
#
# Each benchmark's output goes to OUT_DIR/<name>.txt, with the date and the 1-minute load
# average before and after it. Needs the Fashion-MNIST IDX files
# (apt-get install dataset-fashion-mnist) and BioTorch (pip install --no-deps biotorch==0.0.16).
# About 25 minutes on 2 cores. --quick runs every benchmark with its --quick flag and every
# training command at tiny size (CREDITAUDIT_SET): a check that the set runs, numbers aside.
set -euo pipefail
args=() quick=()
for arg in "$@"; do
  if [ "$arg" = --quick ]; then quick=(--quick); else args+=("$arg"); fi
done
out=${args[0]:?usage: bash benchmarks/docs_set.sh OUT_DIR [PYTHON] [--quick]}
py=${args[1]:-.venv/bin/python}
if [ ${#quick[@]} -gt 0 ]; then
  export CREDITAUDIT_SET="data.n_train=744 data.n_test=256 data.train_subset=512 model.d=16 optim.epochs=1 diagnostics.eval_samples=256 diagnostics.rho_samples=16 diagnostics.rho_directions=2 diagnostics.null_draws=2"
fi
fm=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
mkdir -p "$out"
load() { cut -d' ' -f1 /proc/loadavg; }
bench() {  # name, command...
  local name=$1; shift
  { echo "# $(date -u +%FT%TZ) load $(load): $*"
    "$@" || echo "# FAILED with exit status $? (one benchmark failing does not stop the rest)"
    echo "# $(date -u +%FT%TZ) load $(load): done"; } > "$out/$name.txt" 2>&1
  echo "$name: $(tail -1 "$out/$name.txt")"
}
{ uname -srm; nproc; "$py" -c 'import torch, platform; print("torch", torch.__version__, "python", platform.python_version())'
  git rev-parse HEAD 2>/dev/null || echo "no git checkout here"; } > "$out/machine.txt"
bench steps "$py" benchmarks/bench_steps.py "${quick[@]}"
bench peers "$py" benchmarks/bench_peers.py --clock cpu "${quick[@]}"
bench peers_lenet "$py" benchmarks/bench_peers.py --net lenet --clock cpu "${quick[@]}"
bench peers_resnet20 "$py" benchmarks/bench_peers.py --net resnet20 --batch 32 --steps 3 --clock cpu "${quick[@]}"
bench protocol "$py" benchmarks/bench_protocol.py --threads 1 --repeats 3 "${quick[@]}"
bench epoch "$py" benchmarks/bench_epoch.py --n-train 50000 --epochs 3 --methods bp dfa "${quick[@]}"
bench loader "$py" benchmarks/bench_loader.py --samples 50000 --batch-size 128 --repeats 3 "${quick[@]}"
bench held_out "$py" benchmarks/bench_held_out.py --data-dir "$fm" --repeats 5 "${quick[@]}"
bench stacked "$py" benchmarks/bench_stacked.py --parts steps --rounds 3 "${quick[@]}"
bench ep "$py" benchmarks/bench_ep.py --repeats 5 --data-dir "$fm" "${quick[@]}"
# the end-of-run block on the README's image runs: train one epoch each, then time the block
runs="$out/runs"
"$py" -m creditaudit train --method dfa --arch convmixer --dataset fashion-mnist --data-dir "$fm" \
  --set data.train_subset=2000 --epochs 1 --threads 1 --set diagnostics.end_of_run=false \
  --set run.progress=false --out "$runs" > "$out/train_convmixer.txt" 2>&1
"$py" -m creditaudit train --method dfa --arch vit --set data.in_dim=3072 --set data.n_train=2000 \
  --epochs 1 --threads 1 --set diagnostics.end_of_run=false --set run.progress=false \
  --out "$runs" > "$out/train_vit.txt" 2>&1
bench end_of_run "$py" benchmarks/bench_end_of_run.py --threads 1 "$runs"/dfa-convmixer-* "$runs"/dfa-vit-*
# the demo from an empty data cache, as a fresh machine runs it
demo_cache=$(mktemp -d)
bench demo env CREDITAUDIT_CACHE="$demo_cache" /usr/bin/time -f "demo: %e s wall, %U s user, %S s system" \
  "$py" -m creditaudit demo --out "$out/demo"
rm -rf "$demo_cache"
bench sweep "$py" benchmarks/bench_sweep.py --repeats 1 "${quick[@]}"
