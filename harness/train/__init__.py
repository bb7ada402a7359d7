"""What trains: the trainer (its step, the batch it collects, its checkpoint), the update, the
critic, rewards, evaluation and its step-0 cache, step metrics, stale and overlapped rollouts,
checkpoint files, and the process group (torchrun, FSDP2)."""
