"""The package's version, below every module that records it (provenance, the API)."""

__version__ = "0.8.0"
