"""``python -m creditaudit`` — the same as the ``creditaudit`` command."""

from creditaudit.cli import main

raise SystemExit(main())
