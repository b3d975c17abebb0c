"""creditaudit: train local credit-assignment rules and audit their headline numbers."""

from __future__ import annotations

__version__ = "0.1.0"
