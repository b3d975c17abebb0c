"""Any ``nn.Module`` from the command line: the ``module`` architecture.

``model.factory`` (``package.module:name``) builds the network from ``model.args`` (and
``model.none_args``: keyword arguments passed as None, which TOML cannot write), and
:func:`creditaudit.adapt` names its states ``model.states``. The factory is a guest
(:mod:`creditaudit.guests`): its module and the modules of its own code that it imports are
part of the run id (:meth:`ModuleArchitecture.guest_code`); what it prints goes to stderr;
an exception or ``sys.exit`` in it is one line naming it, and so is one its network raises
while training (an ``nn.Sequential`` of torch's layers has no code of the factory's: the
model's :attr:`~creditaudit.models.adapted.AdaptedModel.origin` names it). A network whose
first layer does not read the data's samples (3-channel convolutions on 1-channel images, a
Linear of other width) is refused in one line saying what the layer expects, what the data
holds and how to adapt the network.
"""

from __future__ import annotations

import contextlib
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from creditaudit.caller import set_key
from creditaudit.config import opt
from creditaudit.errors import ConfigError, CreditAuditError, GuestError, ModelContractError
from creditaudit.formatting import error_text
from creditaudit.guests import Guest, make_guest, own_sources, unread_source
from creditaudit.guests.blame import blame, exit_message
from creditaudit.guests.settings import settings_kept
from creditaudit.models.adapt_arguments import NotLogitsError, not_logits_line
from creditaudit.models.adapted import AdaptedModel, adapt
from creditaudit.models.registry import READOUT_HELP, STATES_HELP, AdaptedArchitecture, register
from creditaudit.version import OWN_PACKAGE

# The layers whose input shape says what a network reads (first_layer_mismatch).
FIRST_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


@dataclass
class ModuleOptions:
    factory: str = opt("", "the callable that builds the network, as package.module:name (a "
                       "class or function returning an nn.Module whose forward gives (B, "
                       "classes) logits), e.g. creditaudit.testing.zoo:resnet20")
    args: dict[str, Any] | None = opt(None, "keyword arguments of the factory, a table (e.g. "
                                      "{n = 1, in_channels = 1}; --set model.args.n=1)")
    none_args: list[str] | None = opt(None, "keyword arguments of the factory passed as None, "
                                      "which a TOML table cannot hold (e.g. [\"weights\"] "
                                      "for weights=None)")
    states: list[str] | None = opt(None, STATES_HELP)
    readout: list[str] | None = opt(None, READOUT_HELP)
    terminal_ln: bool | None = opt(None, "whether the readout normalises h_L with a LayerNorm "
                                   "(None = probed: the logits do not move when h_L is "
                                   "scaled)")


def load_factory(path: Any) -> Callable[..., Any]:
    """The callable ``model.factory`` names (``package.module:name`` or
    ``package.module.name``); a one-line ConfigError when it cannot be imported or called.
    Importing runs the module's code, as installing a plugin does (what it prints goes to
    stderr; a torch setting it changes, ``torch.set_default_dtype`` at the top of the file,
    is put back and refused in one GuestError line naming the factory)."""
    if not isinstance(path, str) or not path.strip():
        raise ConfigError("model.arch='module' needs model.factory: the callable that builds "
                          "your network, as package.module:name (e.g. "
                          "creditaudit.testing.zoo:resnet20)")
    try:  # importing runs the module's code: a setting it changes is its doing, not ours
        with contextlib.redirect_stdout(sys.stderr), settings_kept(f"model factory {path!r}"):
            factory = pkgutil.resolve_name(path)
    except GuestError:
        raise
    except ValueError:
        raise ConfigError(f"model.factory={path!r} is not a module path: write "
                          "package.module:name, e.g. creditaudit.testing.zoo:resnet20") from None
    except ModuleNotFoundError as err:
        raise ConfigError(f"model.factory={path!r}: no module named {err.name!r}; install its "
                          "package or put its folder on PYTHONPATH (the command line also "
                          "finds a module in the folder it runs in)") from None
    except AttributeError as err:
        raise ConfigError(f"model.factory={path!r}: {error_text(err)}") from None
    except SystemExit as err:
        raise GuestError(exit_message(f"model factory {path!r}", err)) from None
    except Exception as err:  # noqa: BLE001 - the user's module failed to import
        raise ConfigError(f"model.factory={path!r}: importing it raised "
                          f"{type(err).__name__}: {error_text(err)}") from None
    if not callable(factory):
        raise ConfigError(f"model.factory={path!r} is a {type(factory).__name__}, not "
                          "callable: name a class or function that returns an nn.Module")
    return factory


def factory_guest(path: str) -> Guest | None:
    """The factory ``path`` names as a guest: the module ``path`` names and the module that
    defines the callable (they differ for a re-export), each with every module of its own
    code it imports (:func:`creditaudit.guests.own_sources`); creditaudit's own modules
    (``creditaudit.testing.zoo``) are left out, as its version names their code: None when nothing
    else is left. A GuestError (one line) when the code of one of those modules cannot be
    read (:func:`creditaudit.guests.unread_source`: a notebook's, a zip archive's)."""
    factory = load_factory(path)
    named = path.partition(":")[0] if ":" in path else path.rpartition(".")[0]
    defining = getattr(factory, "__module__", None)
    modules = [m for m in (named, defining) if isinstance(m, str)]
    for module in modules:  # its digest would leave that code out: an edit to it, unseen
        if module.split(".")[0] != OWN_PACKAGE and (why := unread_source(module)):
            raise GuestError(f"model factory {path!r}: {why}, so the run id cannot tell its "
                             "code from other code; define the factory in a .py file in a "
                             "folder on sys.path (or install its package)")
    found = own_sources(modules)
    if found is None:
        return None
    return make_guest(f"model factory {path!r}", *found)


def _check_names(value: Any, key: str, minimum: int) -> None:
    if not (isinstance(value, list | tuple) and len(value) >= minimum
            and all(isinstance(n, str) and n for n in value)):
        need = "at least two names, h_0 … h_L" if minimum > 1 else "one or more names"
        flag = f"--set {key}='[\"layer1\", \"layer2\"]'"
        raise ConfigError(f"{key} must be a list of submodule names ({need}), got {value!r}; "
                          f"e.g. {set_key(flag, key, ['layer1', 'layer2'])}")


def factory_args(options: Any) -> dict[str, Any]:
    """The factory's keyword arguments: ``model.args`` plus ``model.none_args`` as None."""
    return {**(options.args or {}), **dict.fromkeys(options.none_args or [])}


@register
class ModuleArchitecture(AdaptedArchitecture[ModuleOptions]):
    """Any ``nn.Module``: ``model.factory(**model.args)`` adapted with ``model.states``
    (:func:`creditaudit.adapt`), for samples as the dataset stores them."""

    name = "module"
    label = "Module"
    rank = 40

    def check(self, input_shape: tuple[int, ...]) -> None:
        options = self.options
        load_factory(options.factory)
        _check_names(options.states, "model.states", 2)
        if options.readout is not None:
            _check_names(options.readout, "model.readout", 1)
        args = options.args
        if args is not None and not (isinstance(args, dict)
                                     and all(isinstance(k, str) for k in args)):
            example = set_key("--set model.args.n=1", "model.args.n", 1)
            raise ConfigError(f"model.args must be a table of keyword arguments, got "
                              f"{args!r}; e.g. {example}")
        empty = [k for k, v in (args or {}).items() if v is None]
        if empty:  # a run's config.toml could not hold it
            example = set_key(f"--set 'model.none_args=[\"{empty[0]}\"]'", "model.none_args",
                              [empty[0]])
            raise ConfigError(f"model.args.{empty[0]} is None, which a config file cannot "
                              f"hold (TOML has no null): list it in model.none_args instead, "
                              f"e.g. {example}")
        none_args = options.none_args
        if none_args is not None and not (isinstance(none_args, list | tuple) and all(
                isinstance(n, str) and n for n in none_args)):
            example = set_key("--set 'model.none_args=[\"weights\"]'", "model.none_args",
                              ["weights"])
            raise ConfigError(f"model.none_args must be a list of argument names, got "
                              f"{none_args!r}; e.g. {example}")
        both = sorted(set(none_args or ()) & set(args or {}))
        if both:  # the factory would get None, the record would say the model.args value
            raise ConfigError(f"model.none_args names {both[0]!r}, which model.args gives as "
                              f"{args[both[0]]!r}: give the argument in one of them")

    def guest_code(self) -> Guest | None:
        return factory_guest(self.options.factory)

    def same_as_default(self) -> dict[str, Any]:
        """An empty ``model.args`` or ``model.none_args`` passes the factory what none does."""
        return {name: None for name in ("args", "none_args")
                if getattr(self.options, name) is not None and not getattr(self.options, name)}

    def build(self, *, input_shape: tuple[int, ...], n_classes: int) -> AdaptedModel:
        self.check(input_shape)
        options = self.options
        factory, args = load_factory(options.factory), factory_args(options)
        what = f"model factory {options.factory!r}"
        try:
            with contextlib.redirect_stdout(sys.stderr), settings_kept(what):
                net = factory(**args)
        except CreditAuditError:
            raise
        except SystemExit as err:
            raise GuestError(exit_message(what, err)) from None
        except Exception as err:  # noqa: BLE001 - the user's factory refused its arguments
            raise ConfigError(f"model.factory={options.factory!r} with model.args={args} "
                              f"raised {type(err).__name__}: {error_text(err)}") from None
        if not isinstance(net, nn.Module):
            raise ConfigError(f"model.factory={options.factory!r} returned a "
                              f"{type(net).__name__}, not an nn.Module")
        if any(t.is_meta for t in net.parameters()) and not torch.empty(0).is_meta:
            raise GuestError(f"{what} returns the same network object on every call: return "
                             "a new one (this call got back the one sized on the meta device)")
        if not any(p.requires_grad for p in net.parameters()):
            held = sum(1 for _ in net.parameters())
            why = (f"its {held} parameters all have requires_grad=False" if held
                   else "it has no parameters")
            raise GuestError(f"{what} builds a {type(net).__name__} with nothing to train "
                             f"({why}): return a network with trainable parameters")
        held = sorted({str(p.dtype).removeprefix("torch.") for p in net.parameters()
                       if p.is_floating_point() and p.dtype != torch.float32})
        if held:  # the command line feeds float32 samples (bf16 by autocast, not weights)
            raise GuestError(f"{what} builds a {type(net).__name__} with {held[0]} parameters, "
                             "but the command line trains float32 networks on float32 "
                             "samples (--precision bf16 autocasts them): return it in float32 "
                             "(without .double() or .to(dtype))")
        try:
            with blame(what):
                model = adapt(net, options.states, options.readout, input_shape=input_shape,
                              terminal_ln=options.terminal_ln)
        except NotLogitsError as err:  # the fix is the factory's, on the command line
            raise ModelContractError(not_logits_line(err.net_name, err.got, what)) from None
        except GuestError as err:
            mismatch = first_layer_mismatch(net, input_shape)
            if mismatch is None:
                raise
            raise ConfigError(f"model.factory={options.factory!r}: {mismatch}") from err
        model.origin = what  # the network's failures in training are the factory's
        if model.n_classes != n_classes:
            raise ConfigError(f"{type(net).__name__} returns {model.n_classes} logits but the "
                              f"data has {n_classes} classes: give the factory its number "
                              f"of classes in model.args")
        return model


def first_layer_mismatch(net: nn.Module, input_shape: tuple[int, ...]) -> str | None:
    """What is wrong when the first convolution or Linear ``net`` runs cannot read samples
    of ``input_shape`` (one sample, as the data stores it), and how to adapt the network;
    None when that layer reads them (the failure lies elsewhere)."""
    calls: list[tuple[str, nn.Module, tuple[int, ...]]] = []
    names = {module: name for name, module in net.named_modules()}

    def record(module: nn.Module, inputs: tuple[Any, ...]) -> None:
        if not calls and inputs and isinstance(inputs[0], torch.Tensor):
            calls.append((names.get(module, "?"), module, tuple(inputs[0].shape)))

    handles = [m.register_forward_pre_hook(record) for m in net.modules()
               if isinstance(m, FIRST_LAYERS)]
    modes = [(m, m.training) for m in net.modules()]
    reference = next((p for p in net.parameters() if p.is_floating_point()), None)
    try:
        net.eval()
        with torch.no_grad(), contextlib.redirect_stdout(sys.stderr):
            net(torch.zeros((2, *input_shape), dtype=reference.dtype if reference is not None
                            else torch.float32,
                            device=reference.device if reference is not None else None))
    except Exception:  # noqa: BLE001, S110 - the failure is what is being explained
        pass
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes:
            module.training = training
    if not calls:
        return None
    name, layer, seen = calls[0]
    sample = "×".join(map(str, input_shape))
    kind = type(layer).__name__
    if isinstance(layer, nn.Linear):
        if seen[-1] == layer.in_features:
            return None
        expects = f"{layer.in_features} input features"
        hint = "give the factory the data's width in model.args if it takes one"
    else:
        channels = seen[1] if len(seen) > 1 else None
        if channels == layer.in_channels:
            return None
        expects = f"{layer.in_channels} input channels"
        wanted = input_shape[0] if input_shape else 1
        example = set_key(f"--set model.args.in_channels={wanted}", "model.args.in_channels",
                          wanted)
        hint = ("give the factory the data's channels in model.args if it takes them (e.g. "
                f"{example})")
    return (f"the network's first layer {name!r} ({kind}) expects {expects}, but the data's "
            f"samples are {sample}; adapt the network to the data: {hint}, or write a factory "
            "of your own that wraps the network (e.g. a module that maps the data to what "
            "its first layer reads) and name that in model.factory")


__all__ = ["ModuleArchitecture", "ModuleOptions", "load_factory", "factory_guest",
           "factory_args", "first_layer_mismatch"]
