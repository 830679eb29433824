"""The plugin's fixture for this directory's tests, whether or not this environment's installed
metadata already lists the ``pytest11`` entry point (an editable install made before it existed)."""

from calltape.testing.plugin import calltape_store

__all__ = ["calltape_store"]
