"""What trains: the trainer's step, the update, the critic, rewards, evaluation and its
cache, step metrics, stale and overlapped rollouts, checkpoints, and the process group."""
