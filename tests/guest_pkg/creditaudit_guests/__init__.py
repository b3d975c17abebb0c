"""Guests that fail at creditaudit's door (tests/guest_pkg/pyproject.toml)."""
