#!/usr/bin/env bash
# Rebuild the literature section's evidence of docs/results.md. Trains nothing.
#
#   bash scripts/build_literature_docs.sh [RESULTS_DIR]     (default results)
#
# The runs' records ship as docs/results/literature/records.tar.gz (record.json and
# config.toml of every run), packed from RESULTS_DIR/literature when that folder exists
# (the runs of `creditaudit experiment literature --scale cpu --out results/literature`).
# The summary (docs/results/literature/literature.md) and the figure
# (docs/figures/literature/literature.png) are always recomputed from that archive, so every
# number on the page can be recomputed from the shipped file (the MNIST and Fashion-MNIST
# files are needed: a run's id includes its data's fingerprint).
set -euo pipefail
results=${1:-results}
python=${PYTHON:-python}
literature=docs/results/literature
mkdir -p "$literature" docs/figures/literature
if [ -d "$results/literature" ]; then
  (cd "$results/literature" && find . -mindepth 2 -maxdepth 2 \( -name record.json -o \
    -name config.toml \) | LC_ALL=C sort | tar -czf - --owner=0 --group=0 --mtime=@0 \
    -T -) > "$literature/records.tar.gz"
fi
unpacked=$(mktemp -d)
tar -xzf "$literature/records.tar.gz" -C "$unpacked"
# exit status 1 and stderr only say some runs are missing; the summary lists them
$python -m creditaudit experiment literature --scale cpu --out "$unpacked" --no-train -q \
  > /dev/null 2>&1 || true
sed "s#$unpacked#results/literature#g" "$unpacked/experiments/literature.cpu.fashion-mnist.md" \
  > "$literature/literature.md"
$python -c "import json, sys
from creditaudit.study.figures.literature import save_literature_figure
save_literature_figure(json.load(open(sys.argv[1])), sys.argv[2])" \
  "$unpacked/experiments/literature.cpu.fashion-mnist.json" docs/figures/literature > /dev/null
rm -f docs/figures/literature/*.pdf
rm -rf "$unpacked"
echo "docs/results/literature/ and docs/figures/literature/ rebuilt"
