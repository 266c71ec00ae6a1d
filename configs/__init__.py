"""The catalog and example specs, installed with the package (read with importlib.resources)."""
