"""GPU cost of the credit rules (fp32 and bf16) and the expected runtime of the paper scale.

1. ms per ``rule.train_step`` (AdamW, batch 128) of every rule on a terminal-LN ResidualMLP
   with CIFAR-shaped flattened inputs (in_dim 3072, d=256, L=4) and of BP/DFA on ViT-Mini,
   in fp32 and under bf16 autocast. Each time is the median of ``--repeats`` blocks of
   ``--steps`` steps, with ``torch.cuda.synchronize()`` around every block.
2. Real training epochs (``--epochs``, default 2) of the ``paper`` scale (50 000
   CIFAR-shaped uint8 images, random crop + flip, per-epoch diagnostics on 1280 samples)
   through :class:`Trainer`, per method: the record's seconds of the last epoch (training +
   diagnostics; the first one also pays for warming up and capturing the step), the first
   epoch's extra and the end-of-run credit-quality block, turned into the expected wall time
   of a 100-epoch run. The images
   are random (CIFAR-10 cannot be downloaded where this was written; the cost of a step does
   not depend on pixel values), written as a CIFAR-10 folder so the real loader reads them.
   The record's ``execution`` says whether the data sat on the GPU and the step was captured
   (``run.cuda_graphs``).

Usage: python benchmarks/bench_gpu.py [--repeats 5] [--steps 30] [--epoch-methods bp dfa ...]
       [--precisions fp32 bf16] [--skip-epochs] [--skip-steps] [--out FILE]. Needs a CUDA
       device; ``--device cpu --n-train 1280`` dry-runs it on a CPU (numbers meaningless).
"""

from __future__ import annotations

import argparse
import atexit
import json
import pickle
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from creditaudit.config import MethodConfig, RunConfig
from creditaudit.data import Dataset
from creditaudit.methods import CreditRule, build_rule
from creditaudit.models import ResidualMLP, ViTMini
from creditaudit.optim import make_adamw
from creditaudit.run.plan import plan_run
from creditaudit.run.trainer import train
from creditaudit.study.experiments.scales import base_config

IN_DIM, N_CLASSES, BATCH = 3072, 10, 128
MLP_METHODS = ("bp", "fa", "dfa", "state-bridge", "credit-bridge", "ep")
VIT_METHODS = ("bp", "dfa")
PAPER_EPOCHS = 100
DEVICE = "cuda"  # a module constant so the script can be dry-run on a CPU


def make_rule(arch: str, method: str, precision: str) -> tuple[CreditRule, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = (ResidualMLP(IN_DIM, 256, N_CLASSES, 4, out_ln=True) if arch == "resmlp"
             else ViTMini(n_classes=N_CLASSES)).to(DEVICE)
    rule = build_rule(model, MethodConfig(name=method), n_classes=N_CLASSES, seed=0)
    rule.to(torch.device(DEVICE))
    rule.set_precision(precision, DEVICE)
    optimizer = make_adamw(rule.trainable_parameters(), lr=1e-3, weight_decay=0.01)
    return rule, optimizer


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def step_ms(arch: str, method: str, precision: str, repeats: int, steps: int) -> float:
    """Median over ``repeats`` blocks of the ms per train step (after 5 warm-up steps)."""
    rule, optimizer = make_rule(arch, method, precision)
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    shape = (BATCH, IN_DIM) if arch == "resmlp" else (BATCH, 3, 32, 32)
    batches = [(torch.randn(shape, device=DEVICE, generator=gen),
                torch.randint(0, N_CLASSES, (BATCH,), device=DEVICE, generator=gen))
               for _ in range(8)]
    for i in range(5):
        rule.train_step(*batches[i % 8], optimizer)
    times = []
    for _ in range(repeats):
        synchronize()
        started = time.perf_counter()
        for i in range(steps):
            rule.train_step(*batches[i % 8], optimizer)
        synchronize()
        times.append((time.perf_counter() - started) / steps * 1e3)
    return statistics.median(times)


def write_random_cifar(parent: Path, n_train: int = 50_000, n_test: int = 10_000,
                       seed: int = 0) -> Path:
    """A cifar-10-batches-py folder (the official pickle layout: five training batches and
    a test batch) of random CIFAR-10-shaped images and labels, so runs read it through the
    real CIFAR loader — normalisation, random crop + flip, data identity and all."""
    folder = parent / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per_batch = -(-n_train // 5)
    sizes = [min(per_batch, n_train - i * per_batch) for i in range(5)] + [n_test]
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name, size in zip(names, sizes, strict=True):
        batch = {b"batch_label": name.encode(),
                 b"data": rng.integers(0, 256, (size, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, N_CLASSES, size).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch))
    return parent


def paper_config(method: str, arch: str, precision: str, data_dir: Path, out: str,
                 epochs: int = 1) -> RunConfig:
    """The paper scale's config of one rule on the random CIFAR-10 folder."""
    return base_config("paper", dataset="cifar10", data_dir=str(data_dir),
                       out_dir=out).replace(**{
        "method.name": method, "model.arch": arch, "optim.epochs": epochs,
        "run.device": DEVICE, "run.precision": precision, "run.progress": False})


def paper_epoch(method: str, arch: str, precision: str, data_dir: Path, dataset: Dataset,
                epochs: int = 2) -> dict[str, Any]:
    """Seconds of the last of ``epochs`` paper-scale epochs (train + diagnostics), the
    first epoch's extra (warm-up, capture) and the rest of the run (set-up, end-of-run
    block), and from them the expected minutes of a 100-epoch run.

    ``dataset``: the folder's data, loaded once (``train(config, dataset=…)`` skips
    reading it again for every run)."""
    with tempfile.TemporaryDirectory() as out:
        config = paper_config(method, arch, precision, data_dir, out, epochs)
        started = time.perf_counter()
        result = train(config, dataset=dataset)
        total = time.perf_counter() - started
        record = result.record
    seconds = [e.seconds or 0.0 for e in record.log if e.epoch >= 1]
    epoch, first_extra = seconds[-1], seconds[0] - seconds[-1]
    rest = total - sum(e.seconds or 0.0 for e in record.log)
    return {"method": method, "arch": arch, "precision": precision,
            "status": record.status, "epoch_s": epoch, "first_epoch_extra_s": first_extra,
            "run_s": total, "epochs": epochs,
            "expected_100_epochs_min": (PAPER_EPOCHS * epoch + first_extra + rest) / 60,
            "execution": record.environment.get("execution")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--epoch-methods", nargs="*",
                        default=["bp", "dfa", "state-bridge", "ep", "vit:bp", "vit:dfa"])
    parser.add_argument("--skip-epochs", action="store_true")
    parser.add_argument("--skip-steps", action="store_true",
                        help="only the paper-scale epochs (part 2)")
    parser.add_argument("--epochs", type=int, default=2,
                        help="epochs per run in part 2 (the last one is timed)")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"],
                        choices=("fp32", "bf16"), help="precisions of the epochs (part 2)")
    parser.add_argument("--n-train", type=int, default=50_000,
                        help="training images of the epochs (the paper scale's 50 000)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a dry run of the script (its numbers mean nothing)")
    parser.add_argument("--out", default=None, help="also write the results as JSON")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device; run it on a GPU machine", file=sys.stderr)
        return 1
    name = torch.cuda.get_device_name(0) if DEVICE == "cuda" else platform.machine()
    print(f"{name}, torch {torch.__version__}, python {platform.python_version()}",
          flush=True)
    results: dict[str, Any] = {"device": name, "torch": torch.__version__, "steps": [],
                               "epochs": []}
    print(f"\nms per train step, batch {BATCH} (median of {args.repeats}×{args.steps})")
    print(f"{'arch':8} {'method':14} {'fp32':>8} {'bf16':>8} {'bf16/fp32':>9}")
    plan = [] if args.skip_steps else (
        [("resmlp", m) for m in MLP_METHODS] + [("vit", m) for m in VIT_METHODS])
    for arch, method in plan:
        fp32 = step_ms(arch, method, "fp32", args.repeats, args.steps)
        bf16 = step_ms(arch, method, "bf16", args.repeats, args.steps)
        results["steps"].append({"arch": arch, "method": method, "fp32_ms": fp32,
                                 "bf16_ms": bf16})
        print(f"{arch:8} {method:14} {fp32:8.2f} {bf16:8.2f} {bf16 / fp32:9.2f}", flush=True)
    if not args.skip_epochs:
        data_root = Path(tempfile.mkdtemp(prefix="bench_gpu_cifar_"))
        atexit.register(shutil.rmtree, data_root, ignore_errors=True)
        data_dir = write_random_cifar(data_root, n_train=args.n_train)
        dataset = plan_run(paper_config("bp", "resmlp", "fp32", data_dir, "unused")).load_data()
        print(f"\npaper scale ({args.n_train} CIFAR-shaped images, batch 128): one epoch "
              "through Trainer")
        print(f"{'arch':8} {'method':14} {'prec':5} {'epoch s':>8} {'run s':>8} "
              f"{'100 epochs (min)':>16}  execution")
        for item in args.epoch_methods:
            arch, method = item.split(":") if ":" in item else ("resmlp", item)
            for precision in args.precisions:
                row = paper_epoch(method, arch, precision, data_dir, dataset, args.epochs)
                results["epochs"].append(row)
                print(f"{arch:8} {method:14} {precision:5} {row['epoch_s']:8.2f} "
                      f"{row['run_s']:8.1f} {row['expected_100_epochs_min']:16.1f}  "
                      f"{row['execution']}"
                      + ("" if row["status"] == "completed" else f"  ({row['status']})"),
                      flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
