"""Example sweep and search specs, the main job's default among them (TOML)."""
