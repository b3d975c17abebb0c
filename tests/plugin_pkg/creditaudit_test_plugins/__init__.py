"""Plugins of every kind, from outside creditaudit: the proof that the four extension points
need no change to creditaudit (tests/test_outside_plugins.py).

- :class:`~.rules.SparseDFA` (``method.name = "sparse-dfa"``): DFA with sparse feedback;
- :class:`~.models.PlainMLPArchitecture` (``model.arch = "plain-mlp"``): an MLP without skips
  or LayerNorm;
- :class:`~.datasets.GaussianMixture` (``data.name = "gaussian-mixture"``): a seeded mixture
  of Gaussians;
- :class:`~.diagnostics.SoftmaxSaturation` (protocol diagnostic ``e``): the share of
  evaluation samples whose softmax is saturated.
"""
