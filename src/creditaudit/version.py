"""The package version (its own module so low layers can read it without the package)."""

__version__ = "0.1.0"
