"""The built-in catalog: accelerators, nodes, fabrics, fleets and workloads (TOML)."""
