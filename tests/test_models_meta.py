"""Models sized on the meta device (run plans, reports): the same shapes as a real build, no
memory, no draws, and none of PyTorch's compiler imported on the way."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from creditaudit.config import RunConfig
from creditaudit.models import build_model
from creditaudit.models.meta import on_meta_device
from creditaudit.registry import ARCHITECTURES

# The built-in architectures that build from options alone, with an input they accept.
INPUTS = {"resmlp": (40,), "student": (40,), "vit": (3, 32, 32), "convmixer": (3, 32, 32)}


def test_every_option_built_architecture_is_listed():
    assert {a.name for a in ARCHITECTURES.builtin_classes()} - set(INPUTS) == {
        "module", "own-loop"}


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_meta_build_has_the_real_builds_shapes_and_draws_nothing(name):
    sized = {} if name == "student" else {"model.d": 16, "model.n_blocks": 2}
    options = RunConfig().replace(**{"model.arch": name, **sized}).model
    shape = INPUTS[name]
    state = torch.random.get_rng_state()
    with on_meta_device():
        meta = build_model(options, input_shape=shape, n_classes=10)
    assert torch.equal(torch.random.get_rng_state(), state)  # no stream advanced
    real = build_model(options, input_shape=shape, n_classes=10)
    assert all(p.is_meta for p in meta.parameters())
    assert [(n, p.shape) for n, p in meta.named_parameters()] == [
        (n, p.shape) for n, p in real.named_parameters()]
    assert meta.describe() == real.describe()


def test_sizing_on_meta_imports_no_compiler():
    """PyTorch computes the meta versions of normal_, trunc_normal_'s erfinv_, clamp_ and
    randn through references that import torch._dynamo (~1.2 s per process): skipped there.
    (Other meta ops, such as ViT's ``randn(…) * 0.02``, still import it: that costs time
    once per process, nothing else.)"""
    code = ("import sys, torch\n"
            "from creditaudit.config import RunConfig\n"
            "from creditaudit.models import build_model\n"
            "from creditaudit.models.meta import on_meta_device\n"
            "for arch, shape in (('resmlp', (40,)), ('student', (40,))):\n"
            "    o = RunConfig().replace(**{'model.arch': arch}).model\n"
            "    with on_meta_device():\n"
            "        build_model(o, input_shape=shape, n_classes=10)\n"
            "    with on_meta_device():\n"
            "        t = torch.empty(3)\n"
            "        torch.nn.init.trunc_normal_(t)\n"
            "        t.normal_().clamp_(-1, 1)\n"
            "        torch.randn(2, 3), torch.rand((2,)), torch.randn_like(t)\n"
            "print('torch._dynamo' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False", done.stderr
