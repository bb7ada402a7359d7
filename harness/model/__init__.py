"""What loads and runs the model: loading (and the embedded model), LoRA adapters, the log-prob
forward, the KV-cache helpers, training precision, the sampler's keep set (truncation), tensor digests."""
