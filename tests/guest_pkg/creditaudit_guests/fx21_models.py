"""Architectures whose names collide (tests/test_plugin_names.py).

- ``resmlp``: a plugin registered under a built-in's name (the built-in wins; said in a
  warning when the name is used);
- ``fx21-twin``: registered by this distribution, and by a second distribution the test
  installs beside it (``RivalTwin``): the name is refused in one line naming both.
"""

from creditaudit.models.registry import ResMLPArchitecture


class Shadow(ResMLPArchitecture):
    name, label, rank = "resmlp", "Shadowing ResMLP", 100


class Twin(ResMLPArchitecture):
    name, label, rank = "fx21-twin", "Twin", 100


class RivalTwin(ResMLPArchitecture):
    name, label, rank = "fx21-twin", "Rival twin", 100
