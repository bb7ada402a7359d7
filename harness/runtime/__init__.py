"""What watches and records the process: its provenance (machine, versions, git state, weights and
data digests), degenerate-run warnings, peak memory and the process's age, the C allocator's settings."""
