"""The interface every credit rule implements (:class:`CreditRule`), with what a rule's
code imports beside it: what a training step reports (defined in
:mod:`creditaudit.methods.step_report`), the options several rules share (in
:mod:`creditaudit.methods.options`), and the cross-entropy's precision and output error
e = softmax − onehot that feedback credits start from (in
:mod:`creditaudit.methods.cross_entropy`).

A rule produces a *credit* a_l for every state h_0 … h_L (its estimate of ∂CE/∂h_l, same
sign as the gradient) and takes training steps. Local rules train every module on the local
surrogate of :mod:`creditaudit.methods.surrogate` with the credit of the state it writes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, Generic, TypeVar, cast

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from creditaudit.config import MethodConfig
from creditaudit.methods.cross_entropy import (  # importable from here too
    loss_precision,
    one_hot,
    output_error,
)
from creditaudit.methods.logits import checked_logits
from creditaudit.methods.optimizer_check import checks_optimizer
from creditaudit.methods.options import (  # the shared options, importable from here too
    FeedbackOptions,
    LocalOptions,
    NoRuleOptions,
    RuleOptions,
    ScaleOptions,
    SeededOptions,
)
from creditaudit.methods.step_report import (  # importable from here too
    StepResult,
    all_finite,
    step_result,
)
from creditaudit.methods.surrogate import credit_gradient, local_backward, local_forward
from creditaudit.models.adapted import AdaptedModel
from creditaudit.models.contract import ResidualNet
from creditaudit.registry import Component

FEEDBACK_KINDS = ("none", "fixed_random", "learned", "symmetric", "sign_concordant")


# The steps a stack of runs takes (creditaudit.methods.stacked), each with the
# rule methods it calls: end to end (CE + λΣ‖f_l‖² backpropagated, as BP's), projected
# (a_l = s·B_l for the rule's projected_signal s, on the local surrogate, as DFA's) and block
# FA (a_l = B_l a_{l+1} from the rule's propagate).
STACKED_STEPS: dict[str, tuple[str, ...]] = {
    "end_to_end": (), "projected": ("projected_signal", "stacked_credits"), "fa": ("propagate",)}


# Covariant: a rule of LocalFeedbackOptions is a rule of LocalOptions (the helpers below
# that read options a rule may lack say which Options they need through ``self``'s type).
OptionsT = TypeVar("OptionsT", covariant=True)
# The options of the built-in rules' shared parents (all reach the common keys).
RuleOptionsT = TypeVar("RuleOptionsT", bound=RuleOptions, covariant=True)


class CreditRule(Component, Generic[OptionsT]):
    """Base class: one credit rule bound to one model and its ``[method]`` section.

    A rule describes itself with class attributes, which the registry, the CLI, figures and
    reports read (so adding a rule touches no other file):

    - ``name``: the ``method.name`` that selects it (lower case, e.g. ``"dfa"``);
    - ``label``: how figures and tables show it (e.g. ``"DFA"``);
    - ``Options``: a dataclass of the rule's own settings (:func:`creditaudit.config.opt`
      fields; combine :class:`SeededOptions`, :class:`ScaleOptions`,
      :class:`FeedbackOptions`, :class:`LocalOptions` with your own), set as
      ``method.<option>`` in configs and read as ``self.options.<option>``. Declared once,
      as the parameter of the base class (``class MyRule(CreditRule[MyOptions])``), which
      also types ``self.options``; ``Options = MyOptions`` in the class body works too. A
      rule that declares ``feedback_seed`` draws from the generator it is given
      (:meth:`draws_feedback`);
    - ``id_version``: bump it when the rule starts computing something else for the same
      options (its records are then never reused as finished runs);
    - ``credit_formula``: a one-line formula of its credit (e.g. ``"a_l = B_l^T e"``);
    - ``feedback_kind``: ``"none"``, ``"fixed_random"`` (feedback drawn once and never
      trained — the fresh-feedback null redraws it with :meth:`draw_feedback`),
      ``"learned"`` (an auxiliary net or trained feedback), ``"symmetric"`` (the forward
      weights themselves, as in backprop) or ``"sign_concordant"`` (the forward weights'
      signs with magnitudes that are not learned, as in uSF and brSF);
    - ``local``: True when every block is trained on the local surrogate ⟨f_l, â_{l+1}⟩ with
      the rule's own credit (the conformance suite then checks the update against it);
    - ``adapted_models``: True when the rule also trains models built by
      :func:`creditaudit.adapt` (any ``nn.Module`` with named states), not only residual
      contract models; ``residual_reason`` says, for a rule that cannot, why it needs the
      residual contract (the one-line refusal of binding it to an adapted model);
    - ``color`` and ``marker``: optional matplotlib style of the rule in figures (never
      inherited: a subclass without its own gets a distinct fallback style);
    - ``rank``: where listings put it (lower first; ties by name);
    - ``baseline``: True for the frozen-blocks baseline of diagnostic (d) (its runs are the
      baseline other rules' accuracy is compared with, and are not judged on (d));
    - ``own_parts``: ``{key of its state_dict: (what it is, the options that drive it)}`` of
      the parts the rule trains itself (auxiliary nets, local classifiers): what a run
      names when one of them holds NaN/Inf (:func:`~creditaudit.methods.footprint.
      nonfinite_part`);
    - ``expected_failures``: ``{check name: reason}`` of conformance checks
      (:func:`creditaudit.testing.check_rule`) the rule fails by design;
    - ``stacked_step``: which of the :data:`STACKED_STEPS` computes the rule's step when K
      runs train as one stacked model (``sweep --stack``) or in a captured CUDA graph, or
      None (it trains alone). Read with :meth:`stacks_as`: never inherited, since a
      subclass that changes the step would otherwise be stepped as its parent.

    Subclasses implement :meth:`credits` and :meth:`train_step`, and extend
    :meth:`state_dict`, :meth:`load_state_dict` and :meth:`to` with what they own.

    ``self.options`` is the ``[method]`` section the rule was built with: its ``Options``
    fields (typed by ``OptionsT``) plus the keys every rule reads, such as ``penalty``
    (:class:`RuleOptions`).
    """

    options: OptionsT
    # ids of the model's parameters that binding the rule froze (build_rule): the rule's own
    # doing (``frozen``, ``trainable_blocks``), never reported as frozen outside it.
    frozen_by_binding: frozenset[int] = frozenset()

    credit_formula: ClassVar[str] = ""
    feedback_kind: ClassVar[str] = "none"
    local: ClassVar[bool] = False
    adapted_models: ClassVar[bool] = False
    residual_reason: ClassVar[str] = "it is written for the residual contract only"
    color: ClassVar[str | None] = None
    marker: ClassVar[str | None] = None
    expected_failures: ClassVar[dict[str, str]] = {}
    own_parts: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {}
    baseline: ClassVar[bool] = False
    stacked_step: ClassVar[str | None] = None

    def __init__(self, model: ResidualNet, config: MethodConfig, *, n_classes: int,
                 generator: torch.Generator) -> None:
        self.model = model
        # The section composed of MethodConfig and Options (creditaudit.config.composed).
        self.options = cast(OptionsT, config)
        self.n_classes = n_classes

    @property
    def config(self) -> Any:
        """The older name of :attr:`options` (the same object)."""
        return self.options

    @config.setter
    def config(self, value: Any) -> None:
        self.options = value

    @classmethod
    def draws_feedback(cls) -> bool:
        """Whether the rule draws from the generator seeded by ``method.feedback_seed``
        (it declares that option), so reports show that seed beside the run seed."""
        return "feedback_seed" in cls.option_names()

    @classmethod
    def generator_seed(cls, options: Any, run_seed: int) -> int | None:
        """The seed the rule's generator is derived from when it is built with ``options``
        (its ``[method]`` section): its own ``feedback_seed``, else the run seed; None for a
        rule that draws nothing (:meth:`draws_feedback`)."""
        if not cls.draws_feedback():
            return None
        own = getattr(options, "feedback_seed", None)
        return run_seed if own is None else int(own)

    @classmethod
    def same_as_default(cls, options: Any, run_seed: int) -> dict[str, Any]:
        """Own options (in ``options``, its ``[method]`` section) whose value, given
        explicitly, trains what their default trains, by name, with that default (the run is
        then the default's run: one id, one record): a ``feedback_seed`` equal to the run
        seed."""
        seed = getattr(options, "feedback_seed", None)
        return {"feedback_seed": None} if cls.draws_feedback() and seed == run_seed else {}

    @classmethod
    def ignored_options(cls, options: Any) -> dict[str, str]:
        """Own options set (in ``options``) to a value other than their default that these
        options leave unread, by name, with why: refused, as they would be recorded and name
        a run of their own yet change nothing (:func:`~creditaudit.methods.check_options`)."""
        return {}

    @classmethod
    def refused_options(cls, options: Any) -> dict[str, str]:
        """Own options whose values (in ``options``, its ``[method]`` section), each legal
        alone, together leave every credit zero, so that no block ever trains, by name,
        each with why and what to give instead (a clause that follows ``method.KEY=VALUE``):
        refused before a run starts (:func:`~creditaudit.methods.check_options`), as a
        value out of its own range is."""
        return {}

    @classmethod
    def style(cls, attribute: str) -> str | None:
        """The rule's own ``color`` or ``marker`` — declared on this class itself, never
        inherited from a parent rule (a DFA variant must not look like DFA)."""
        return cls.__dict__.get(attribute)

    @classmethod
    def stacks_as(cls) -> str | None:
        """The rule's ``stacked_step`` as declared on this class itself (None when it
        declares none): a subclass of a rule that steps stacked trains alone until it says
        that its step is still its parent's."""
        return cls.__dict__.get("stacked_step")

    # --- credit -------------------------------------------------------------------------
    def credits(self, x: Tensor, y: Tensor) -> list[Tensor]:
        """The rule's credits [a_0 … a_L] for a batch, each shaped like h_l (detached).

        Must not change parameters, their ``.grad`` or any random stream used by training.
        """
        raise NotImplementedError

    # --- training -----------------------------------------------------------------------
    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every ``train_step`` a rule defines checks, the first time, that its optimiser
        holds the parameters the rule trains (:mod:`creditaudit.methods.optimizer_check`)."""
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("train_step")
        if callable(step) and not getattr(step, "checks_optimizer", False):
            cls.train_step = checks_optimizer(step)  # type: ignore[method-assign]

    def train_step(self, x: Tensor, y: Tensor, optimizer: torch.optim.Optimizer) -> StepResult:
        """One optimiser step on a batch: (B, …) inputs, (B,) int64 labels; ``optimizer``
        must hold every parameter of :meth:`trainable_parameters` (checked on its first
        step with this rule: one-line ConfigError otherwise)."""
        raise NotImplementedError

    def local_train_step(self: CreditRule[LocalOptions], x: Tensor, y: Tensor,
                         optimizer: torch.optim.Optimizer, credits_of: Any) -> StepResult:
        """One step of the local surrogate with the credits ``credits_of(local)`` returns
        for the step's :class:`LocalPass` (``[a_0 … a_L]``, detached): every block on
        ⟨f_l(h_l), â_{l+1}⟩ (+ the penalty), the embedding on ⟨h_0, â_0⟩, the readout on its
        exact cross-entropy. What a new local rule needs besides its credit."""
        optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            local = local_forward(self.model, x)
            ce = F.cross_entropy(loss_precision(checked_logits(self.model, local.logits, y)), y)
            grads = [self.credit_gradient(a, y.shape[0]) for a in credits_of(local)]
        result = step_result(ce, local.logits, y, local.states[-1])
        if result.finite:
            local_backward(local, ce, grads, self.options.penalty)
            optimizer.step()
        return result

    def credit_gradient(self: CreditRule[LocalOptions], credit: Tensor, batch: int) -> Tensor:
        """What the local surrogate sends into a module's output for credit ``a``: â / B
        (or a / B with ``method.normalise_credit=false``); see :func:`credit_gradient`."""
        return credit_gradient(credit, batch, normalise=self.options.normalise_credit)

    def weight_alignment(self) -> dict[str, list] | None:
        """Per-layer alignment of the rule's feedback with the forward weights, for rules
        whose feedback matrix B stands in for one weight matrix W in the backward pass:
        ``{"layers": [names], "angle": [∠(B, W) in degrees], "norm_ratio": [‖B‖/‖W‖]}``
        (Frobenius norms). None for rules without such a pairing (BP, block FA, DFA, …)."""
        return None

    def set_precision(self, precision: str, device_type: str) -> None:
        """Train under bf16 autocast (``precision="bf16"``) or plain fp32."""
        self.precision, self.device_type = precision, device_type

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context of training steps (credits for diagnostics are computed
        without it, in the parameters' dtype)."""
        if getattr(self, "precision", "fp32") == "bf16":
            return torch.autocast(self.device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Model parameters this rule updates (auxiliary nets have their own optimisers)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def frozen_outside(self) -> dict[str, int]:
        """{name: number of values} of the model's parameters this rule does not train
        (not in :meth:`trainable_parameters`) though binding it did not freeze them: what
        the caller froze (``requires_grad`` off, before binding or since) or an earlier
        rule bound to the same network froze. Names are the user's network's (an adapted
        model's, without its ``net.`` prefix). What binding froze is known to rules bound
        by :func:`~creditaudit.methods.build_rule` (``creditaudit.rule``)."""
        net = self.model.net if isinstance(self.model, AdaptedModel) else self.model
        trained = {id(p) for p in self.trainable_parameters()}
        return {name: p.numel() for name, p in net.named_parameters()
                if id(p) not in trained and id(p) not in self.frozen_by_binding}

    def end_epoch(self, epoch: int, n_epochs: int) -> dict[str, float]:
        """Hook after each trained epoch (``epoch`` ≥ 1 of ``n_epochs``), called by
        ``creditaudit train`` and by :class:`~creditaudit.run.recorder.Recorder`'s
        ``epoch()``; returns extra per-epoch record fields (e.g. bridge errors)."""
        return {}

    def reads_run_length(self) -> str | None:
        """Why this bound rule's training depends on the run's length in epochs (the
        ``n_epochs`` :meth:`end_epoch` is given), as a clause; None when it does not. A
        :class:`~creditaudit.run.recorder.Recorder` refuses such a rule unless its config
        gives ``optim.epochs``."""
        return None

    # --- feedback (feedback_kind "fixed_random") --------------------------------------------
    def draw_feedback(self, generator: torch.Generator) -> Any:
        """A fresh draw of the rule's fixed random feedback (same shapes and scale), for the
        fresh-feedback null; only rules whose ``feedback_kind`` is ``"fixed_random"``."""
        raise NotImplementedError(f"{type(self).__name__} has no fixed random feedback")

    @contextlib.contextmanager
    def using_feedback(self, feedback: Any):  # noqa: ANN201 - a context manager
        """Compute credits with ``feedback`` instead of the training feedback inside the
        block (the training feedback is restored on exit, also after an error)."""
        raise NotImplementedError(f"{type(self).__name__} has no fixed random feedback")
        yield  # pragma: no cover

    def credits_under(self, x: Tensor, y: Tensor, feedbacks: Iterable[Any]
                      ) -> Iterator[list[Tensor]]:
        """The credits [a_0 … a_L] under each feedback set in turn (the fresh-feedback
        null's draws), lazily; the training feedback is back in place afterwards.

        ``feedbacks`` yields what :meth:`draw_feedback` returns. This default runs
        :meth:`credits` once per set under :meth:`using_feedback`. Rules whose credits use
        the forward pass only through quantities the feedback does not change (FA, DFA)
        override it to forward once for all sets.
        """
        for feedback in feedbacks:
            with self.using_feedback(feedback):
                yield self.credits(x, y)

    def run_metrics(self, x: Tensor, y: Tensor) -> dict[str, Any]:
        """Rule-specific end-of-run metrics on an evaluation set (e.g. EP's convergence).

        ``x`` ``(N, …)`` inputs, ``y`` ``(N,)`` labels. Returns JSON-able record fields
        (none by default). Like :meth:`credits`, must not change parameters, their
        ``.grad``, the rule's own state or any random stream used by training.
        """
        return {}

    # --- persistence --------------------------------------------------------------------
    def state_dict(self) -> dict[str, object]:
        return {}

    def load_state_dict(self, state: dict[str, object]) -> None:
        return None

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The optimisers the rule trains its own parts with (auxiliary nets, local
        classifiers), by the key of their state in :meth:`state_dict`: a checkpoint's saved
        state of each is checked against it before anything is loaded. None by default."""
        return {}

    def to(self, device: torch.device) -> CreditRule:
        """Move the model and everything the rule owns (feedback matrices, auxiliary nets)
        to ``device``; subclasses extend this for what they own."""
        self.model.to(device)
        return self


__all__ = ["StepResult", "loss_precision", "one_hot", "output_error", "FEEDBACK_KINDS",
           "RuleOptions", "NoRuleOptions", "SeededOptions", "ScaleOptions", "FeedbackOptions",
           "LocalOptions", "STACKED_STEPS", "CreditRule", "all_finite", "step_result"]
