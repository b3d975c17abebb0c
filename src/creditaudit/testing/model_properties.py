"""The checks of the architecture conformance suite (:func:`~creditaudit.testing.check_model`),
one function each: ``check(ArchitectureClass, options, input_shape)`` returns when the
architecture conforms and raises AssertionError saying what is wrong otherwise.
:mod:`creditaudit.testing.models` says what each check asserts and why, and runs them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from creditaudit.errors import ConfigError
from creditaudit.models import Architecture, ResidualNet
from creditaudit.models.contract import (
    LAYOUTS,
    check_contract,
    feature_rows,
    from_feature_rows,
    readout_parameters,
    split_branch,
    without_zero_samples,
)
from creditaudit.models.registry import build_architecture
from creditaudit.testing.common import (
    CLASSES,
    F64,
    IMAGE,
    IN_DIM,
    changes_of_the_forward,
    relative_error,
)

TINY_MODEL_OPTIONS: dict[str, Any] = {"d": 8, "n_blocks": 3, "heads": 2, "mlp_ratio": 2,
                                      "patch": 2, "kernel": 3, "w2_std": 0.1}
PROBE_SHAPES: tuple[tuple[int, ...], ...] = ((IN_DIM,), (40,), (3072,), (1, 28, 28),
                                              (3, 32, 32), IMAGE, (1, 7, 7))

MODEL_BATCH = 5
CLOSE = 1e-12  # float64 reruns of the same operations


def default_shape(cls: type[Architecture]) -> tuple[int, ...]:
    """The sample shape the checks feed ``cls`` unless told: 2×8×8 images or 6 features."""
    return IMAGE if cls.input_kind == "image" else (IN_DIM,)


def _build(cls: type[Architecture], options: Any, input_shape: tuple[int, ...],
           seed: int = 0, native: bool = False) -> ResidualNet:
    """``cls`` built under ``seed``, in float64 for the checks (``native``: as built)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_architecture(cls(options), input_shape=input_shape, n_classes=CLASSES)
    return model if native else model.to(F64)


def _inputs(model: ResidualNet, seed: int = 1, batch: int = MODEL_BATCH) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *model.input_shape, generator=generator, dtype=F64)


def _close(got: Tensor, want: Tensor) -> bool:
    return got.shape == want.shape and bool(torch.allclose(got, want, rtol=CLOSE, atol=CLOSE))


# --- the checks ---------------------------------------------------------------------------
def builds_a_contract_model(cls: type[Architecture], options: Any,
                            input_shape: tuple[int, ...]) -> None:
    model = _build(cls, options, input_shape)
    assert isinstance(model, ResidualNet), \
        f"build() returned a {type(model).__name__}, not a creditaudit.models.ResidualNet"
    check_contract(model)
    assert isinstance(model.terminal_ln, bool), \
        f"terminal_ln is a {type(model.terminal_ln).__name__}; declare it as a bool"
    assert model.state_layout in LAYOUTS, \
        f"state_layout {model.state_layout!r} is not one of {', '.join(LAYOUTS)}"
    assert model.n_classes == CLASSES, \
        f"asked for {CLASSES} classes, the model says n_classes={model.n_classes}"
    assert len(model.blocks) >= 1, "the model has no blocks"
    # a run asks for its data's classes, not the suite's: a readout sized for 4 would pass
    other = CLASSES + 3
    with torch.random.fork_rng(devices=[]):
        wider = build_architecture(cls(options), input_shape=input_shape, n_classes=other)
    _, logits = wider.to(F64).eval().forward_states(_inputs(wider, batch=2))
    assert tuple(logits.shape) == (2, other), \
        f"asked for {other} classes, the logits have shape {tuple(logits.shape)}: size " \
        "the readout by build()'s n_classes"
    # the checks run in float64; a run trains the model as built, on float32 data
    native = _build(cls, options, input_shape, native=True)
    odd = [(n, t.dtype) for n, t in [*native.named_parameters(), *native.named_buffers()]
           if t.is_floating_point() and t.dtype != torch.float32]
    assert not odd, (f"parameters must be float32, as the data a run feeds them is: "
                     f"{odd[0][0]} is {odd[0][1]}; build in torch's default float32 "
                     "(drop .double() or dtype=)")


def states_follow_the_declared_layout(cls: type[Architecture], options: Any,
                                      input_shape: tuple[int, ...]) -> None:
    model = _build(cls, options, input_shape).eval()
    x = _inputs(model)
    states, logits = model.forward_states(x)
    assert len(states) == len(model.blocks) + 1, \
        f"forward_states returned {len(states)} states for {len(model.blocks)} blocks"
    dims = {"vectors": 2, "tokens": 3, "maps": 4}[model.state_layout]
    first = tuple(states[0].shape)
    for layer, h in enumerate(states):
        shape = tuple(h.shape)
        assert len(shape) == dims and shape[0] == MODEL_BATCH, \
            f"state {layer} has shape {shape}; {model.state_layout!r} states are " \
            f"{['(B, d)', '(B, T, d)', '(B, d, H, W)'][dims - 2]} with B={MODEL_BATCH}"
        assert shape == first, f"state {layer} has shape {shape}, state 0 {first}"
        width = shape[1] if model.state_layout in ("vectors", "maps") else shape[2]
        assert width == model.d, f"state {layer} has {width} features, the model says d=" \
                                 f"{model.d}"
    assert tuple(logits.shape) == (MODEL_BATCH, CLASSES), \
        f"logits have shape {tuple(logits.shape)}, expected ({MODEL_BATCH}, {CLASSES})"
    grads = torch.autograd.grad(logits.sum(), states, allow_unused=True)
    missing = [layer for layer, g in enumerate(grads) if g is None]
    assert not missing, f"the logits do not depend on state(s) {missing} in the graph"


def states_are_the_residual_chain(cls: type[Architecture], options: Any,
                                  input_shape: tuple[int, ...]) -> None:
    model = _build(cls, options, input_shape).eval()
    x = _inputs(model)
    with torch.no_grad():
        states, logits = model.forward_states(x)
        assert _close(model.embed(x), states[0]), "state 0 is not embed(x)"
        for layer, block in enumerate(model.blocks):
            h = states[layer]
            want = h + block(h) if model.residual else block(h)
            assert _close(states[layer + 1], want), (
                f"state {layer + 1} is not h_{layer} {'+ ' if model.residual else ''}"
                f"blocks[{layer}](h_{layer})")
        assert _close(model.readout(states[-1]), logits), "the logits are not readout(h_L)"
        for layer, h in enumerate(states):
            assert _close(model.forward_from(layer, h), logits), \
                f"forward_from({layer}, h_{layer}) does not reproduce the logits"
        assert _close(model(x), logits), "forward(x) differs from forward_states(x)'s logits"


def samples_are_independent_in_eval_mode(cls: type[Architecture], options: Any,
                                         input_shape: tuple[int, ...]) -> None:
    model = _build(cls, options, input_shape).eval()
    x = _inputs(model)
    other = x.clone()
    other[1:] = _inputs(model, seed=2)[1:] * 3.0
    with torch.no_grad():
        states, logits = model.forward_states(x)
        states_other, logits_other = model.forward_states(other)
    for layer, (a, b) in enumerate(zip(states, states_other)):
        assert _close(a[:1], b[:1]), \
            f"in eval mode, state {layer} of sample 0 depends on the other samples"
    assert _close(logits[:1], logits_other[:1]), \
        "in eval mode, the logits of sample 0 depend on the other samples"


def forward_leaves_its_input_alone(cls: type[Architecture], options: Any,
                                   input_shape: tuple[int, ...]) -> None:
    model = _build(cls, options, input_shape)
    for mode in ("training", "eval"):
        model.train(mode == "training")
        x = _inputs(model)
        kept = x.clone()
        with torch.no_grad():
            states, _ = model.forward_states(x)
            assert torch.equal(x, kept), \
                f"forward_states() changed its input batch in place ({mode} mode)"
            model(x)
            assert torch.equal(x, kept), \
                f"forward() changed its input batch in place ({mode} mode)"
            for layer, h in enumerate(states):
                h_kept = h.clone()
                model.forward_from(layer, h)
                assert torch.equal(h, h_kept), \
                    f"forward_from({layer}, h) changed h in place ({mode} mode)"


def forward_leaves_the_model_alone(cls: type[Architecture], options: Any,
                                   input_shape: tuple[int, ...]) -> None:
    model = _build(cls, options, input_shape)
    x = _inputs(model)
    model.eval()
    changed = changes_of_the_forward(model, lambda: _forward_everything(model, x), buffers=True)
    assert not changed, (
        f"an eval-mode forward changed {', '.join(changed[:3])}: the diagnostics forward the "
        "model in eval mode between training steps, so training would depend on what was "
        "measured; leave parameters and buffers as they are in eval mode")
    model.train()
    changed = changes_of_the_forward(model, lambda: _forward_everything(model, x),
                                     buffers=False)
    assert not changed, (
        f"a training-mode forward changed the parameters {', '.join(changed[:3])}: only the "
        "optimizer the rule is handed may write them")


def _forward_everything(model: ResidualNet, x: Tensor) -> None:
    with torch.no_grad():
        states, _ = model.forward_states(x)
        model(x)
        for layer, h in enumerate(states):
            model.forward_from(layer, h)


def branch_split_adds_up_to_the_block(cls: type[Architecture], options: Any,
                                      input_shape: tuple[int, ...]) -> None:
    model = _build(cls, options, input_shape).eval()
    with torch.no_grad():
        states, _ = model.forward_states(_inputs(model))
        for layer, block in enumerate(model.blocks):
            split = split_branch(block)
            if split is None:
                continue
            hidden, last = split
            parts = hidden(states[layer])
            if isinstance(parts, tuple):
                assert len(parts) == 2, f"blocks[{layer}].hidden returns {len(parts)} " \
                                        "values; return u or (u, skip)"
                rebuilt = parts[1] + last(parts[0])
            else:
                rebuilt = last(parts)
            assert _close(rebuilt, block(states[layer])), \
                f"blocks[{layer}]: its split (hidden, output layer) does not add up to the block"


def terminal_ln_is_what_the_readout_does(cls: type[Architecture], options: Any,
                                         input_shape: tuple[int, ...]) -> None:
    model = _build(cls, options, input_shape).eval()
    with torch.no_grad():
        states, _ = model.forward_states(_inputs(model))
        h = without_zero_samples(states[-1])
        # A large scale makes a LayerNorm's eps negligible (relative effect ~1e-11).
        c = 1e3 / float(h.abs().max().clamp_min(1e-12))
        base, scaled = model.readout(c * h), model.readout(4.0 * c * h)
    change = relative_error(scaled, base)
    invariant = change < 1e-6
    if model.terminal_ln:
        assert invariant, (
            f"terminal_ln is True, but scaling h_L changes the logits (rel. {change:.2e}): "
            "the readout has no terminal LayerNorm")
    else:
        assert not invariant, (
            "terminal_ln is False, but the readout is invariant to scaling h_L: it hides a "
            "terminal LayerNorm (declare terminal_ln = True)")


# Where on the circle h(t) = cos t·u + sin t·v the readout is read: three points fix the
# affine map, the others test it.
CIRCLE = (0.0, torch.pi / 2, torch.pi, 1.0, 2.5, 4.0)
READOUT_TOLERANCE = 1e-8  # float64, relative
# The run of features on each of which u and v have zero mean, equal norms and are orthogonal
# (where the width is a multiple of it): a GroupNorm's groups of 4k channels see a circle too.
CIRCLE_CHUNK = 4


def _circle_axes(d: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """u, v (d,) float64 of norm √d, orthogonal with zero mean and equal norms on every
    run of :data:`CIRCLE_CHUNK` features (on the whole vector when ``d`` is no multiple of
    it): every point cos t·u + sin t·v has one mean and variance over the whole vector and
    over any group of whole runs — where a LayerNorm, RMSNorm or GroupNorm is linear."""
    chunk = CIRCLE_CHUNK if d % CIRCLE_CHUNK == 0 else d
    u, v = torch.randn(2, d // chunk, chunk, generator=generator, dtype=F64)
    u, v = u - u.mean(-1, keepdim=True), v - v.mean(-1, keepdim=True)
    v = v - (v * u).sum(-1, keepdim=True) / (u * u).sum(-1, keepdim=True) * u
    scale = 0.5 + torch.rand(d // chunk, 1, generator=generator, dtype=F64)  # runs differ
    u, v = (u / u.norm(dim=-1, keepdim=True) * scale).flatten(), \
        (v / v.norm(dim=-1, keepdim=True) * scale).flatten()
    return u * d ** 0.5 / u.norm(), v * d ** 0.5 / v.norm()


def readout_is_a_linear_head(cls: type[Architecture], options: Any,
                             input_shape: tuple[int, ...]) -> None:
    model = _build(cls, options, input_shape).eval()
    with torch.no_grad():
        states, _ = model.forward_states(_inputs(model))
        rows = feature_rows(states[-1][:1])  # (1, positions, d) or (1, d)
        d = rows.shape[-1]
        u, v = _circle_axes(d, torch.Generator().manual_seed(2))
        t = torch.tensor(CIRCLE, dtype=F64)[:, None]
        points = (t.cos() * u + t.sin() * v)  # (6, d), each a feature row a LayerNorm scales
        circle = points.view(len(CIRCLE), *[1] * (rows.dim() - 2), d).expand(
            len(CIRCLE), *rows.shape[1:])  # every position of a sample holds its point
        logits = model.readout(from_feature_rows(circle, states[-1][:1].expand(
            len(CIRCLE), *states[-1].shape[1:])))
    centre = (logits[0] + logits[2]) / 2
    cos_part, sin_part = (logits[0] - logits[2]) / 2, logits[1] - centre
    want = centre + t.cos() * cos_part + t.sin() * sin_part
    error = relative_error(logits[3:], want[3:])
    assert error < READOUT_TOLERANCE, (
        f"the readout is not a linear head after an optional terminal LayerNorm (on states "
        f"whose feature vectors keep one mean and variance its logits are not affine in them: "
        f"rel. {error:.2e}): it hides layers the blocks do not declare, which every rule "
        "would train by backprop and no diagnostic measures (make them blocks)")


def description_matches_the_model(cls: type[Architecture], options: Any,
                                  input_shape: tuple[int, ...]) -> None:
    model = _build(cls, options, input_shape).eval()
    with torch.no_grad():
        states, _ = model.forward_states(_inputs(model))
    described = model.describe()
    facts = {
        "d": feature_rows(states[0]).shape[-1], "n_blocks": len(model.blocks),
        "layout": model.state_layout, "terminal_ln": model.terminal_ln,
        "residual": model.residual, "arch": cls.name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "input_shape": list(model.input_shape),
    }
    wrong = [f"{key}={getattr(described, key)!r} (the model has {value!r})"
             for key, value in facts.items() if getattr(described, key) != value]
    assert not wrong, "describe() says " + ", ".join(wrong)


def parameters_belong_to_one_part(cls: type[Architecture], options: Any,
                                  input_shape: tuple[int, ...]) -> None:
    model = _build(cls, options, input_shape).eval()
    parts = {"embed": list(model.embed.parameters()),
             **{f"blocks[{i}]": list(b.parameters()) for i, b in enumerate(model.blocks)},
             "readout": readout_parameters(model)}
    owner: dict[int, str] = {}
    for part, params in parts.items():
        for p in params:
            assert id(p) not in owner, f"{part} shares a parameter with {owner[id(p)]}"
            owner[id(p)] = part
    every = list(model.parameters())
    x = _inputs(model)
    states, _ = model.forward_states(x)
    outputs = {"embed": model.embed(x), "readout": model.readout(states[-1].detach()),
               **{f"blocks[{i}]": block(states[i].detach())
                  for i, block in enumerate(model.blocks)}}
    for part, output in outputs.items():
        grads = torch.autograd.grad(output.sum(), every, allow_unused=True)
        reached = {owner[id(p)] for p, g in zip(every, grads)
                   if g is not None and bool(g.abs().max() > 0)}
        stray = sorted(reached - {part})
        assert not stray, f"the output of {part} depends on parameters of {', '.join(stray)}"


def check_refuses_what_build_cannot_build(cls: type[Architecture], options: Any,
                                          input_shape: tuple[int, ...]) -> None:
    for shape in dict.fromkeys((tuple(input_shape), *PROBE_SHAPES)):
        try:
            cls(options).check(shape)
        except ConfigError as err:
            assert shape != tuple(input_shape), f"check() refuses the inputs under test: {err}"
            assert "\n" not in str(err), f"check()'s refusal of {shape} is not one line"
            continue
        except Exception as err:  # noqa: BLE001 - the wrong kind of refusal
            raise AssertionError(f"check() refused inputs of shape {shape} with "
                                 f"{type(err).__name__} ({err}); raise a one-line "
                                 "creditaudit.errors.ConfigError") from None
        try:
            model = _build(cls, options, shape).eval()
            with torch.no_grad():
                logits = model(_inputs(model, batch=2))
        except Exception as err:  # noqa: BLE001 - what check() should have refused
            raise AssertionError(f"check() accepts inputs of shape {shape}, but building or "
                                 f"running the model fails: {type(err).__name__}: "
                                 f"{err}") from None
        assert tuple(logits.shape) == (2, CLASSES), \
            f"on inputs of shape {shape} the logits have shape {tuple(logits.shape)}"


def building_is_deterministic_under_a_seed(cls: type[Architecture], options: Any,
                                           input_shape: tuple[int, ...]) -> None:
    first, again = _build(cls, options, input_shape), _build(cls, options, input_shape)
    for (name, a), b in zip(first.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), f"two builds under one seed differ at {name}"
    other = _build(cls, options, input_shape, seed=1)
    assert any(not torch.equal(a, b) for a, b in zip(first.state_dict().values(),
                                                     other.state_dict().values())), \
        "builds under seeds 0 and 1 are identical: build() must draw from torch's RNG"


__all__ = ["TINY_MODEL_OPTIONS", "PROBE_SHAPES", "default_shape", "builds_a_contract_model",
           "states_follow_the_declared_layout", "states_are_the_residual_chain",
           "samples_are_independent_in_eval_mode", "forward_leaves_its_input_alone",
           "forward_leaves_the_model_alone", "branch_split_adds_up_to_the_block",
           "terminal_ln_is_what_the_readout_does", "description_matches_the_model",
           "parameters_belong_to_one_part", "check_refuses_what_build_cannot_build",
           "building_is_deterministic_under_a_seed"]
