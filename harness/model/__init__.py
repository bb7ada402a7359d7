"""What loads and runs the model: loading, LoRA adapters, the log-prob forward, the KV-cache
helpers, training precision, the sampler's truncation (keep set), tensor digests."""
