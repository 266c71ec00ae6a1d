"""Fitted constants of the physics models (TOML), installed with the package."""
