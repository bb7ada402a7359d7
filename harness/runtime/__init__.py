"""What watches and records the process: provenance (machine, versions, weights and data
digests), degenerate-run warnings, peak memory and process age, the C allocator's settings."""
