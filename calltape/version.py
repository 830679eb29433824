"""The package's version, in a leaf module: ``calltape --version`` reads it without importing the
public API (and without importlib.metadata, which costs a tenth of the command line's start-up)."""

__version__ = "0.1.0"
