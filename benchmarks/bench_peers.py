"""Step cost of creditaudit's FA and DFA beside BioTorch's ``fa`` and ``dfa`` on one plain MLP.

The network (no skips, no LayerNorm): x (3072) → Linear(3072, d) → [ReLU → Linear(d, d)] × L
→ ReLU → Linear(d, 10), default d=512, L=4, batch 128, fp32, fused AdamW (lr 1e-3, wd
0.01), one torch thread. Every variant starts from the same weights:

- plain BP: the ``nn.Sequential`` trained by autograd (the reference of every ratio);
- BioTorch ``fa`` / ``dfa`` (``BioModule(mode=...)``, version 0.0.16): per-Linear FA
  (each Linear's Wᵀ replaced by a fixed B in an otherwise exact backward) and DFA (each
  Linear's input gradient replaced by e·B after the exact one has been computed);
- creditaudit ``bp`` / ``fa`` / ``dfa`` rules on the same layers as a non-residual
  ``ResidualNet`` (embed = first Linear, block l = ReLU → Linear, readout = ReLU → head;
  states are the pre-activations). creditaudit's FA is block-level (a_l = B_l·a_{l+1}, B_l
  standing for the whole block Jacobian, ReLU included), a different algorithm from
  BioTorch's per-Linear ``fa`` with the same matmul count; both DFAs project the output
  error with one fixed matrix per layer.

Rounds as in bench_steps.py: every variant once per round (one untimed step, ``--steps``
timed ones), the order rotated each round, ratios to plain BP paired within a round, median
and range over ``--rounds``; the load average is printed with the results.

BioTorch is optional: ``pip install --no-deps biotorch==0.0.16`` (it imports with torch
alone; its declared dependencies — torchvision, jupyter, tensorboard, … — are not needed
here), or ``pip install -e '.[peers]'`` to take its full dependency list.

Usage: python benchmarks/bench_peers.py [--width 512] [--depth 4] [--rounds 9] [--steps 10]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from bench_steps import CONTENTION_SLACK, is_contended, load_text, ratio_text, rotated
from creditaudit.config import MethodConfig
from creditaudit.methods import build_rule
from creditaudit.models.contract import ResidualNet
from creditaudit.optim import make_adamw

IN_DIM, N_CLASSES, BATCH = 3072, 10, 128
N_BATCHES = 8
WARMUP_STEPS = 5
MIN_ROUNDS = 9
INSTALL_HINT = ("bench_peers.py needs BioTorch: pip install --no-deps biotorch==0.0.16 "
                "(or pip install -e '.[peers]' for its full dependency list)")

Step = Callable[[Tensor, Tensor], None]


class PlainMLP(ResidualNet):
    """The benchmark's MLP as a non-residual ResidualNet (states: pre-activations)."""

    def __init__(self, d: int, n_blocks: int) -> None:
        super().__init__()
        self.d, self.n_classes, self.residual = d, N_CLASSES, False
        self.embed = nn.Linear(IN_DIM, d)
        self.blocks = nn.ModuleList(nn.Sequential(nn.ReLU(), nn.Linear(d, d))
                                    for _ in range(n_blocks))
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(d, N_CLASSES))

    def readout(self, h: Tensor) -> Tensor:
        return self.head(h)

    def as_sequential(self) -> nn.Sequential:
        """The same layers (copies) as one nn.Sequential."""
        layers: list[nn.Module] = [self.embed]
        for block in self.blocks:
            layers += list(block)
        layers += list(self.head)
        return copy.deepcopy(nn.Sequential(*layers))


def autograd_step(model: nn.Module, forward: Callable[[Tensor, Tensor], Tensor]) -> Step:
    """zero_grad → CE(forward(x, y)) → backward → fused AdamW step."""
    optimizer = make_adamw([p for p in model.parameters() if p.requires_grad], lr=1e-3,
                           weight_decay=0.01)

    def step(x: Tensor, y: Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(forward(x, y), y).backward()
        optimizer.step()

    return step


def rule_step(base: PlainMLP, name: str) -> Step:
    model = copy.deepcopy(base)
    rule = build_rule(model, MethodConfig(name=name), n_classes=N_CLASSES, seed=0)
    rule.set_precision("fp32", "cpu")
    optimizer = make_adamw(rule.trainable_parameters(), lr=1e-3, weight_decay=0.01)

    def step(x: Tensor, y: Tensor) -> None:
        if not rule.train_step(x, y, optimizer).finite:
            raise RuntimeError(f"creditaudit {name}: non-finite step")

    return step


def variants(d: int, n_blocks: int) -> dict[str, Step]:
    """Every timed variant, all from the same initial weights."""
    from biotorch.module.biomodule import BioModule

    torch.manual_seed(0)
    base = PlainMLP(d, n_blocks)
    plain = base.as_sequential()
    x = torch.randn(4, IN_DIM)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # BioTorch uses deprecated module backward hooks
        bio_fa = BioModule(base.as_sequential(), mode="fa")
        bio_dfa = BioModule(base.as_sequential(), mode="dfa", output_dim=N_CLASSES)
    with torch.no_grad():  # the same network in every variant
        for other in (bio_fa.module, bio_dfa.module, base):
            if not torch.allclose(other(x), plain(x), rtol=1e-5, atol=1e-6):
                raise RuntimeError("the BioTorch conversion changed the network's function")
    return {
        "plain BP": autograd_step(plain, lambda x, y: plain(x)),
        "BioTorch fa": autograd_step(bio_fa, lambda x, y: bio_fa(x)),
        "BioTorch dfa": autograd_step(
            bio_dfa, lambda x, y: bio_dfa(x, targets=y, loss_function=F.cross_entropy)),
        "creditaudit bp": rule_step(base, "bp"),
        "creditaudit fa": rule_step(base, "fa"),
        "creditaudit dfa": rule_step(base, "dfa"),
    }


def time_variant(step: Step, batches: list[tuple[Tensor, Tensor]], steps: int) -> float:
    """ms per step over ``steps`` timed steps after one untimed one."""
    step(*batches[0])
    started = time.perf_counter()
    for index in range(steps):
        step(*batches[index % len(batches)])
    return (time.perf_counter() - started) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512, help="hidden width d")
    parser.add_argument("--depth", type=int, default=4, help="hidden d×d layers L")
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant/round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help="a seconds-long run at tiny size that checks the script works "
                             "(what the docs tests run); its numbers mean nothing")
    parser.add_argument("--keep-denormals", action="store_true",
                        help="leave subnormal floats on (by default they are flushed to zero)")
    args = parser.parse_args()
    # The feedback-trained plain MLP drifts into subnormal activations and gradients after a
    # few rounds; on x86 each subnormal operation costs ~100 cycles, which made later rounds
    # up to 6× slower for the feedback rules (both libraries) and drowned the step cost this
    # benchmark compares. Flush-to-zero times the arithmetic, not the denormal stalls.
    if not args.keep_denormals:
        torch.set_flush_denormal(True)
    if args.quick:
        args.width, args.depth, args.rounds, args.steps = 32, 2, 1, 1
    elif args.rounds < MIN_ROUNDS:
        parser.error(f"--rounds must be at least {MIN_ROUNDS}")
    try:
        import biotorch  # noqa: F401
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(args.threads)
    load_start = load_text()
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(BATCH, IN_DIM, generator=gen),
                torch.randint(0, N_CLASSES, (BATCH,), generator=gen)) for _ in range(N_BATCHES)]
    steps = variants(args.width, args.depth)
    names = tuple(steps)
    for step in steps.values():
        for index in range(WARMUP_STEPS):
            step(*batches[index % N_BATCHES])
    ms: dict[str, list[float]] = {name: [] for name in names}
    loads = []
    for index in range(args.rounds):
        for name in rotated(names, index):
            ms[name].append(time_variant(steps[name], batches, args.steps))
        loads.append(os.getloadavg()[0])
        print(f"  round {index + 1}/{args.rounds}: "
              + ", ".join(f"{n} {ms[n][-1]:.1f}" for n in names)
              + f" ms; 1-min load {loads[-1]:.2f}", flush=True)
    contended = is_contended(loads, args.threads)
    print()
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, nproc "
          f"{os.cpu_count()}, {args.threads} torch thread(s); MLP {IN_DIM} → {args.width} → "
          f"[{args.width}×{args.width}] × {args.depth} → {N_CLASSES}, ReLU, batch {BATCH}, fp32, "
          f"fused AdamW; {args.rounds} rotated rounds × {args.steps} timed steps")
    print(f"start: {load_start}")
    print(f"end: {load_text()}; 1-min load after each round {min(loads):.2f}–{max(loads):.2f}")
    if contended:
        print(f"note: the load exceeded the benchmark's own threads by more than "
              f"{CONTENTION_SLACK}: another job ran beside it, rerun idle")
    print()
    print("| variant | ms/step | ratio to plain BP (range) |")
    print("|---|---:|---:|")
    for name in names:
        ratios = [t / b for t, b in zip(ms[name], ms["plain BP"], strict=True)]
        ratio = "1" if name == "plain BP" else ratio_text(ratios)
        print(f"| {name} | {statistics.median(ms[name]):.1f} | {ratio} |")


if __name__ == "__main__":
    main()
