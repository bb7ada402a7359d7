"""grpo-harness: an experiment harness for ablating GRPO-family RL algorithms on LLMs.

The data path of one training step, each arrow one module::

    prompts (tasks) -> rollout (rollout/) -> rewards (rewards.py, verifiers/)
        -> advantages (algo/) -> per-token loss + KL (algo/) -> aggregate (algo/)
        -> update (trainer.py) -> log (tracking.py)
"""

__version__ = "0.1.0"
