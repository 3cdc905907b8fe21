"""The package version, in a leaf module (results and the CLI read it)."""

__version__ = "0.1.0"
