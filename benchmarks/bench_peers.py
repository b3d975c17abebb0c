"""Step cost of creditaudit's per-layer feedback rules, FA and DFA beside BioTorch's on one net.

Every variant trains the same network from the same weights, batch 128, fp32, fused AdamW
(lr 1e-3, wd 0.01), one torch thread (``--net``, networks in peer_nets.py):

- plain BP: the network trained by autograd (the reference of every ratio);
- BioTorch ``fa``, ``usf``, ``brsf``, ``frsf`` (``BioModule(mode=...)``, version 0.0.16):
  every Linear's and Conv2d's Wᵀ replaced by its feedback in an otherwise exact backward;
  on the MLP also ``dfa`` (each Linear's input gradient replaced by e·B after the exact one
  has been computed);
- creditaudit ``bp``, ``fa-linear``, ``usf``, ``brsf``, ``frsf``, ``kp`` through
  ``creditaudit.adapt`` / ``creditaudit.rule`` (rows marked "adapted"): the per-layer rules
  compute BioTorch's updates (tests/test_biotorch_oracle.py); kp also mirrors W's step in B;
- on the MLP the same rules on creditaudit's own form of it, a non-residual ``ResidualNet``
  (embed = first Linear, block l = ReLU → Linear, readout = ReLU → head; states are the
  pre-activations), with the block-level ``fa`` (a_l = B_l·a_{l+1}, B_l standing for the
  whole block Jacobian, ReLU included: a different algorithm at the same matmul count) and
  ``dfa``.

Rounds as in bench_steps.py: every variant once per round (one untimed step, ``--steps``
timed ones), the order rotated each round, ratios paired within a round (median and range
over ``--rounds``); the per-layer rules are also compared with BioTorch's same rule (kp with
``fa``) in the same round. The load average is printed with the results.

BioTorch is optional: ``pip install --no-deps biotorch==0.0.16`` (it imports with torch
alone; its declared dependencies — torchvision, jupyter, tensorboard, … — are not needed
here), or ``pip install -e '.[peers]'`` to take its full dependency list.

Usage: python benchmarks/bench_peers.py [--net mlp|lenet|resnet20] [--width 512] [--depth 4]
[--rounds 9] [--steps 10] [--clock wall|cpu]
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
from creditaudit import adapt, rule
from creditaudit.optim import make_adamw
from peer_nets import N_CLASSES, NETS, PeerNet

IN_DIM, BATCH = 3072, 128
N_BATCHES = 8
WARMUP_STEPS = 5
MIN_ROUNDS = 9
BIOTORCH_MODES = ("fa", "usf", "brsf", "frsf")
PER_LAYER = ("bp", "fa-linear", "usf", "brsf", "frsf", "kp")
# Each per-layer rule and the BioTorch mode it is compared with in the same round.
TWINS = {"fa-linear": "fa", "usf": "usf", "brsf": "brsf", "frsf": "frsf", "kp": "fa"}
INSTALL_HINT = ("bench_peers.py needs BioTorch: pip install --no-deps biotorch==0.0.16 "
                "(or pip install -e '.[peers]' for its full dependency list)")

Step = Callable[[Tensor, Tensor], None]


def autograd_step(model: nn.Module, forward: Callable[[Tensor, Tensor], Tensor]) -> Step:
    """zero_grad → CE(forward(x, y)) → backward → fused AdamW step."""
    optimizer = make_adamw([p for p in model.parameters() if p.requires_grad], lr=1e-3,
                           weight_decay=0.01)

    def step(x: Tensor, y: Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(forward(x, y), y).backward()
        optimizer.step()

    return step


def rule_step(model: nn.Module, name: str) -> Step:
    """creditaudit's rule ``name`` on ``model`` (adapted or a contract model), fused AdamW."""
    bound = rule(name, model, seed=0)
    optimizer = make_adamw(bound.trainable_parameters(), lr=1e-3, weight_decay=0.01)

    def step(x: Tensor, y: Tensor) -> None:
        if not bound.train_step(x, y, optimizer).finite:
            raise RuntimeError(f"creditaudit {name}: non-finite step")

    return step


def biomodule(net: nn.Module, mode: str) -> nn.Module:
    from biotorch.module.biomodule import BioModule

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # BioTorch uses deprecated module backward hooks
        return BioModule(copy.deepcopy(net), mode=mode,
                         output_dim=N_CLASSES if mode == "dfa" else None)


def check_same_function(reference: nn.Module, others: list[nn.Module],
                        input_shape: tuple[int, ...]) -> None:
    """Every copy computes the reference's function (in eval mode: no BatchNorm update)."""
    x = torch.randn(4, *input_shape)
    with torch.no_grad():
        for model in (reference, *others):
            model.eval()
        expected = reference(x)
        for model in others:
            if not torch.allclose(model(x), expected, rtol=1e-5, atol=1e-6):
                raise RuntimeError(f"{type(model).__name__} changed the network's function")
        for model in (reference, *others):
            model.train()


def variants(peer: PeerNet) -> dict[str, Step]:
    """Every timed variant, all from the same initial weights."""
    plain = copy.deepcopy(peer.net)
    modes = BIOTORCH_MODES + (("dfa",) if peer.contract is not None else ())
    bio = {mode: biomodule(peer.net, mode) for mode in modes}
    adapted = {name: adapt(copy.deepcopy(peer.net), peer.states, input_shape=peer.input_shape)
               for name in PER_LAYER}
    own = {name: copy.deepcopy(peer.contract) for name in (*PER_LAYER, "fa", "dfa")
           } if peer.contract is not None else {}
    check_same_function(plain, [*bio.values(), *adapted.values(), *own.values()],
                        peer.input_shape)
    steps = {"plain BP": autograd_step(plain, lambda x, y: plain(x))}
    for mode, model in bio.items():
        forward = ((lambda x, y, m=model: m(x, targets=y, loss_function=F.cross_entropy))
                   if mode == "dfa" else (lambda x, y, m=model: m(x)))
        steps[f"BioTorch {mode}"] = autograd_step(model, forward)
    for name, model in adapted.items():
        steps[f"creditaudit {name} (adapted)"] = rule_step(model, name)
    for name, model in own.items():
        steps[f"creditaudit {name}"] = rule_step(model, name)
    return steps


# "cpu": this process's CPU time, which time spent waiting for a core (other jobs on a loaded
# machine) does not count; with one torch thread it is the step's own cost.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def time_variant(step: Step, batches: list[tuple[Tensor, Tensor]], steps: int,
                 clock: Callable[[], float] = time.perf_counter) -> float:
    """ms per step over ``steps`` timed steps after one untimed one."""
    step(*batches[0])
    started = clock()
    for index in range(steps):
        step(*batches[index % len(batches)])
    return (clock() - started) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=tuple(NETS), default="mlp",
                        help="the network (peer_nets.py); --width and --depth are the MLP's")
    parser.add_argument("--width", type=int, default=512, help="hidden width d")
    parser.add_argument("--depth", type=int, default=4, help="hidden d×d layers L")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant/round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="wall time, or this process's CPU time (with one thread, what a "
                             "step costs even when other jobs share the cores)")
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
        args.width, args.depth, args.rounds, args.steps, args.batch = 32, 2, 1, 1, 8
    elif args.rounds < MIN_ROUNDS:
        parser.error(f"--rounds must be at least {MIN_ROUNDS}")
    try:
        import biotorch  # noqa: F401
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(args.threads)
    load_start = load_text()
    torch.manual_seed(0)
    peer = NETS[args.net](IN_DIM, args.width, args.depth)
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(args.batch, *peer.input_shape, generator=gen),
                torch.randint(0, N_CLASSES, (args.batch,), generator=gen))
               for _ in range(N_BATCHES)]
    steps = variants(peer)
    names = tuple(steps)
    for step in steps.values():
        for index in range(WARMUP_STEPS):
            step(*batches[index % N_BATCHES])
    ms: dict[str, list[float]] = {name: [] for name in names}
    loads = []
    for index in range(args.rounds):
        for name in rotated(names, index):
            ms[name].append(time_variant(steps[name], batches, args.steps, CLOCKS[args.clock]))
        loads.append(os.getloadavg()[0])
        print(f"  round {index + 1}/{args.rounds}: "
              + ", ".join(f"{n} {ms[n][-1]:.1f}" for n in names)
              + f" ms; 1-min load {loads[-1]:.2f}", flush=True)
    contended = is_contended(loads, args.threads)
    print()
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, nproc "
          f"{os.cpu_count()}, {args.threads} torch thread(s); {peer.description}, batch "
          f"{args.batch}, fp32, fused AdamW; {args.rounds} rotated rounds × {args.steps} "
          f"timed steps, {args.clock} time")
    print(f"start: {load_start}")
    print(f"end: {load_text()}; 1-min load after each round {min(loads):.2f}–{max(loads):.2f}")
    if contended:
        print(f"note: the load exceeded the benchmark's own threads by more than "
              f"{CONTENTION_SLACK}: another job ran beside it, rerun idle")
    print()
    print("| variant | ms/step | × plain BP (range) | × BioTorch's rule (range) |")
    print("|---|---:|---:|---:|")
    for name in names:
        ratio = "1" if name == "plain BP" else ratio_text(paired(ms, name, "plain BP"))
        rule_name = name.removeprefix("creditaudit ").removesuffix(" (adapted)")
        twin = f"BioTorch {TWINS[rule_name]}" if rule_name in TWINS else None
        versus = ratio_text(paired(ms, name, twin)) if twin else ""
        print(f"| {name} | {statistics.median(ms[name]):.1f} | {ratio} | {versus} |")


def paired(ms: dict[str, list[float]], name: str, reference: str) -> list[float]:
    """``name``'s time over ``reference``'s, round by round."""
    return [t / b for t, b in zip(ms[name], ms[reference], strict=True)]


if __name__ == "__main__":
    main()
