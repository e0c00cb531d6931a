"""The package version (one place: the package, the artifact writer and the demo read it)."""

__version__ = "0.1.0"
