"""Guests: code creditaudit runs but did not write (a plugin, a ``module`` architecture's
factory, the network a ``Recorder`` records) — identified by the content of its source files
(:mod:`~creditaudit.guests.code`) and blamed by name when it fails
(:mod:`~creditaudit.guests.blame`)."""

from __future__ import annotations

from creditaudit.guests.code import (
    Guest,
    file_sha256,
    guests_owning,
    known_paths,
    loaded_sources,
    main_module_name,
    make_guest,
    module_sources,
    own_sources,
    plugin_sources,
    resolved,
    source_digest,
    unread_source,
)

__all__ = ["Guest", "make_guest", "guests_owning", "known_paths", "source_digest",
           "file_sha256", "resolved", "plugin_sources", "loaded_sources", "module_sources",
           "own_sources", "main_module_name", "unread_source"]
