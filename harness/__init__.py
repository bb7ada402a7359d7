"""grpo-harness: an experiment harness for ablating GRPO-family RL algorithms on LLMs.

The data path of one training step (:meth:`harness.train.trainer.Trainer.train_step`)::

    prompts (tasks/) -> rollout (rollout/) -> rewards (train/rewards.py, verifiers/)
        -> advantages (algo/estimators.py) -> per-token loss + KL (algo/) -> aggregate (algo/)
        -> update (train/update.py) -> log (launch/tracking.py)

The packages by job: the registered pieces (``algo/``, ``rollout/``, ``tasks/``, ``tools/``,
``verifiers/``), what trains (``train/``), what loads and runs the model (``model/``), what
launches and records jobs (``launch/``) and what watches the process (``runtime/``); at the top,
``errors``, ``registry`` and ``progress``, which every layer imports, and the entry modules
``run`` and ``sweep``. docs/contributing.md gives the layers' order.
"""

__version__ = "0.1.0"
