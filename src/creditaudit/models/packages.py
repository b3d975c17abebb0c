"""Which installed distributions a network's classes come from.

A network built from a package — a torchvision ResNet, a timm ViT, a transformers BERT,
often inside a small wrapper class of the user's script (``__main__:BertLogits``) — is named
by the distributions of the classes of its modules, so a record and its label say
``transformers`` where the class path alone says ``__main__``. torch and creditaudit are
left out: every network has torch's modules, and both are in the record's environment.
"""

from __future__ import annotations

import functools
import importlib.metadata

from torch import nn

# Not named: torch's own modules are in every network; creditaudit's are its own zoo.
LEFT_OUT = frozenset({"torch", "creditaudit"})


@functools.cache
def _distributions() -> dict[str, list[str]]:
    """Top-level import name → the distributions that provide it (scanned once)."""
    return dict(importlib.metadata.packages_distributions())


def module_distribution(module: str) -> str | None:
    """The name of the installed distribution that provides the Python module ``module``
    (``transformers.models.bert.modeling_bert`` → ``transformers``); None for a script's
    ``__main__``, a folder on the path, or a module no distribution declares."""
    names = _distributions().get(module.split(".")[0]) or []
    return names[0] if names else None


def network_packages(net: nn.Module, *, versions: bool = False) -> list[str]:
    """The distributions the classes of ``net`` and its submodules come from, the
    wrapped class's first, then in the order the modules are registered, torch and
    creditaudit left out; ``versions`` adds ``==version`` (``transformers==5.24.0``)."""
    found: dict[str, None] = {}
    for module in net.modules():
        name = module_distribution(type(module).__module__)
        if name is not None and name.lower() not in LEFT_OUT:
            found.setdefault(name, None)
    if not versions:
        return list(found)
    out = []
    for name in found:
        try:
            out.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(name)
    return out
