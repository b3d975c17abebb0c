"""Matmul FLOPs of one training step per credit rule on a terminal-LN ResidualMLP.

Counts 2·rows·in·out for every matrix product a step computes (forward, backward, credits,
auxiliary nets), and nothing else: LayerNorm, GELU, the d×d elementwise passes of the
fused LayerNorm → Linear backward and the optimiser are memory-bound and left out. A ratio
to BP is then the *FLOP floor* of a rule: the step-time ratio it would reach if time were
matmul FLOPs alone.

Per step, batch B, input width n (3072), state width d, L blocks, C classes:

- BP: forward n·d + 2Ld² + dC; backward ∂W of the embedding (the input needs no gradient),
  ∂W and ∂input of both Linears of every block, ∂W and ∂input of the head.
- DFA: BP's forward and readout. Its credit e·B_l has rank C, so the embedding and every
  block's w2 train through their projected outputs p = F.linear(u, B·W, B·b)
  (methods/projected.py): forward B·W, B·b and p, backward Uᵀu, Bᵀ(Uᵀu) and U·(B·W) —
  products of width C where the dense route had ∂W (B×in×out) and ∂input (B×out×in). Per
  block the single product M = Gᵀn̂ for w1 and the LayerNorm stays (the dense route before
  the fused LayerNorm also had ∂W1 and G·W1); the normalisation comes from the C×C Gram
  matrices B_l B_lᵀ (before: credits e·[B_0 … B_L], C → (L+1)d).
- FA: the dense local route (the fused LayerNorm's model products); credits
  a_l = a_{l+1}·B_lᵀ (L products B×d×d); the head's input gradient is taken twice (once
  for a_L, once for the terminal LN's parameters).
- State Bridge: FA's model products without its credit products; the predictor
  (p = d + 32 + C → H → H → d, H = 256) on the L·B rows of states 0 … L−1: one forward, the
  credit's backward to the inputs through the readout and the predictor, the fit's
  backward to the predictor's weights and its learned layer embedding (before: a second
  forward for the fit).

``--check`` runs one real ``train_step`` of each rule under a dispatch mode that counts
every aten matrix product and prints that count beside the analytic one (and the count of
Credit Bridge after its warm-up, whose double backward is not written out here).

Usage: python benchmarks/step_flops.py [--check] [--quick]
       (prints the table of docs/benchmarks.md)
"""

from __future__ import annotations

import argparse

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from creditaudit.config import RunConfig
from creditaudit.methods import build_rule
from creditaudit.models import ResidualMLP
from creditaudit.optim import make_adamw

IN_DIM, N_CLASSES, BATCH = 3072, 10, 128
LAYER_EMBED = 32
PREDICTOR_HIDDEN = 256
CONFIGS = ((256, 4), (512, 12))


def linear(rows: int, fan_in: int, fan_out: int) -> int:
    """FLOPs of one (rows × fan_in) @ (fan_in × fan_out) product."""
    return 2 * rows * fan_in * fan_out


def model_flops(d: int, n_blocks: int, *, local: bool, fused: bool = True) -> int:
    """Forward + backward of the model itself (embedding, blocks, readout)."""
    b, c = BATCH, N_CLASSES
    forward = linear(b, IN_DIM, d) + 2 * n_blocks * linear(b, d, d) + linear(b, d, c)
    embed_backward = linear(b, IN_DIM, d)  # ∂W only: the input never needs a gradient
    head_backward = 2 * linear(b, d, c)  # ∂W, and ∂input for the terminal LN's γ, β
    if not local or not fused:
        block_backward = 4 * linear(b, d, d)  # ∂W and ∂input of w2 and of w1
    else:  # ∂W2, ∂input of w2, M = Gᵀn̂, and ∂β = W1ᵀ(Gᵀ1) (a d×d matrix-vector product)
        block_backward = 3 * linear(b, d, d) + linear(1, d, d)
    return forward + embed_backward + n_blocks * block_backward + head_backward


def projected_linear_flops(rows: int, fan_in: int, fan_out: int, *, input_grad: bool
                           ) -> int:
    """A Linear trained through p = F.linear(u, B·W, B·b), B of shape (C, fan_out): forward
    B·W, B·b and p; backward Uᵀu, Bᵀ(Uᵀu), Bᵀ(Uᵀ1) and, when u needs it, U·(B·W)."""
    c = N_CLASSES
    weight, bias = linear(c, fan_out, fan_in), linear(1, fan_out, c)
    forward = weight + bias + linear(rows, fan_in, c)
    backward = (linear(fan_in, rows, c) + weight + bias
                + (linear(rows, c, fan_in) if input_grad else 0))
    return forward + backward


def dfa_flops(d: int, n_blocks: int) -> int:
    """DFA's step: dense forward values, projected embedding and w2, M and ∂β per block."""
    b, c = BATCH, N_CLASSES
    forward = linear(b, IN_DIM, d) + 2 * n_blocks * linear(b, d, d) + linear(b, d, c)
    embed = projected_linear_flops(b, IN_DIM, d, input_grad=False)
    block = projected_linear_flops(b, d, d, input_grad=True) + linear(b, d, d) + linear(1, d, d)
    head_backward = 2 * linear(b, d, c)
    scales = (n_blocks + 1) * (linear(c, d, c) + linear(b, c, c))  # Gram, then s·G
    return forward + embed + n_blocks * block + head_backward + scales


def predictor_flops(d: int, n_blocks: int, *, shared_forward: bool = True) -> int:
    """The State Bridge predictor and the readout on its L·B predicted rows."""
    rows, h = n_blocks * BATCH, PREDICTOR_HIDDEN
    p = d + LAYER_EMBED + N_CLASSES
    layers = [(p, h), (h, h), (h, d)]
    forward = sum(linear(rows, i, o) for i, o in layers) + linear(rows, d, N_CLASSES)
    credit_backward = sum(linear(rows, i, o) for i, o in layers) + linear(rows, d, N_CLASSES)
    # ψ's gradients: ∂W and ∂input of every layer (the first layer's input holds the
    # learned layer embedding)
    fit_backward = 2 * sum(linear(rows, i, o) for i, o in layers)
    fit_forward = 0 if shared_forward else sum(linear(rows, i, o) for i, o in layers)
    return forward + credit_backward + fit_forward + fit_backward


def step_flops(method: str, d: int, n_blocks: int, *, before: bool = False,
               fused: bool | None = None) -> int:
    """Matmul FLOPs of one step; ``before``: without this project's step savings;
    ``fused``: override whether blocks use the single-product LayerNorm → Linear backward."""
    b, c = BATCH, N_CLASSES
    if method == "bp":
        return model_flops(d, n_blocks, local=False)
    model = model_flops(d, n_blocks, local=True, fused=not before if fused is None else fused)
    if method == "dfa":
        return model + linear(b, c, (n_blocks + 1) * d) if before else dfa_flops(d, n_blocks)
    if method == "fa":
        return model + n_blocks * linear(b, d, d) + linear(b, d, c)
    if method == "state-bridge":
        return (model + predictor_flops(d, n_blocks, shared_forward=not before)
                + 2 * linear(b, d, c))  # the exact top credit through the readout
    raise ValueError(f"no FLOP count for {method!r}")


class MatmulCounter(TorchDispatchMode):
    """Counts 2·m·k·n for every aten mm / addmm / mv / bmm dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        aten = torch.ops.aten
        if func in (aten.mm.default, aten.addmm.default):
            a, b = args[-2:] if func is aten.addmm.default else args[:2]
            self.flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]
        elif func is aten.mv.default:
            self.flops += 2 * args[0].numel()
        elif func is aten.bmm.default:
            self.flops += 2 * args[0].numel() * args[1].shape[-1]
        return func(*args, **(kwargs or {}))


def counted_flops(method: str, d: int, n_blocks: int) -> int:
    """Matmul FLOPs of one real train_step (the second one, after the optimiser's state)."""
    torch.manual_seed(0)
    model = ResidualMLP(IN_DIM, d, N_CLASSES, n_blocks, out_ln=True)
    # Credit Bridge after its warm-up (value-gradient credits, the costly phase)
    warmup = {"method.warmup_fraction": 0.0} if method == "credit-bridge" else {}
    config = RunConfig().replace(**{"method.name": method, **warmup}).method
    rule = build_rule(model, config, n_classes=N_CLASSES, seed=0)
    optimizer = make_adamw(rule.trainable_parameters(), lr=1e-3, weight_decay=0.01)
    x, y = torch.randn(BATCH, IN_DIM), torch.randint(0, N_CLASSES, (BATCH,))
    rule.train_step(x, y, optimizer)
    with MatmulCounter() as counter:
        rule.train_step(x, y, optimizer)
    return counter.flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="also count the matmuls of one real step per rule; exit 1 when "
                             "a count differs from the analytic one")
    parser.add_argument("--quick", action="store_true",
                        help="a seconds-long run at tiny size that checks the script works "
                             "(what the docs tests run); its numbers mean nothing")
    args = parser.parse_args()
    configs = ((32, 2),) if args.quick else CONFIGS
    mismatches = []
    if args.check:
        for d, n_blocks in configs:
            bp = step_flops("bp", d, n_blocks)
            for method in ("bp", "fa", "dfa", "state-bridge", "credit-bridge"):
                counted = counted_flops(method, d, n_blocks)
                analytic = ("not counted analytically" if method == "credit-bridge" else
                            f"analytic {step_flops(method, d, n_blocks) / 1e9:.4f}")
                print(f"d={d} L={n_blocks} {method}: counted {counted / 1e9:.4f} GFLOP "
                      f"({counted / bp:.3f}× BP), {analytic}")
                if method != "credit-bridge" and counted != step_flops(method, d, n_blocks):
                    mismatches.append(f"d={d} L={n_blocks} {method}")
    print("| model | rule | GFLOP/step before | GFLOP/step now | floor vs BP before | "
          "floor vs BP now |")
    print("|---|---|---:|---:|---:|---:|")
    for d, n_blocks in configs:
        bp = step_flops("bp", d, n_blocks)
        for method in ("bp", "fa", "dfa", "state-bridge"):
            old, new = step_flops(method, d, n_blocks, before=True), step_flops(method, d,
                                                                                n_blocks)
            print(f"| d={d} L={n_blocks} | {method} | {old / 1e9:.3f} | {new / 1e9:.3f} | "
                  f"{old / bp:.3f} | {new / bp:.3f} |")
    if mismatches:
        raise SystemExit(f"counted FLOPs differ from the analytic count: {', '.join(mismatches)}")


if __name__ == "__main__":
    main()
