"""The algorithm variants' registry: :class:`harness.registry.Registry` with the declarations
only algorithm variants make.

Each advantage estimator, policy loss and loss-aggregation mode is a small function registered
under a config string together with its **parameter dataclass**, as every pluggable piece is
(:mod:`harness.registry` says what the dataclass is for)::

    @dataclass
    class GRPOParams:
        name: str = "grpo"
        eps: float = 1e-6

    @ESTIMATORS.register("grpo", params=GRPOParams, grouped=True)
    def grpo(ctx, p: GRPOParams): ...

    spec = ESTIMATORS.spec(cfg.advantage.name)
    out = spec.fn(ctx, spec.build(cfg.advantage))

``needs`` declares the extra inputs a variant requires (``"values"`` for a critic,
``"step_rewards"`` for process supervision), so the trainer computes what is declared without
knowing any variant by name.

``invariances`` declares the exact properties a variant promises (e.g. ``"shift"``: adding a
constant to every reward leaves the advantages unchanged), as names or as a function of its
params when they depend on them. ``tests/test_properties.py`` enumerates the registries and
checks each declared property on generated batches, so a new variant is covered without edits
to the test; the vocabulary of each registry is documented there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, FrozenSet, Optional

from harness import registry


@dataclass(frozen=True)
class Variant(registry.Entry):
    """One registered variant: its function, parameter dataclass and declarations.

    ``grouped``: it needs groups of ``G >= 2`` completions per prompt. ``needs``: extra inputs the
    trainer must compute (e.g. ``("values",)``). ``aggregation``: the ``loss_agg`` mode the
    variant's source prescribes (policy losses). ``invariances``: the properties it promises
    (names, or ``fn(params) -> names``).
    """

    grouped: bool = False
    needs: FrozenSet[str] = field(default_factory=frozenset)
    aggregation: Optional[str] = None
    invariances: Any = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "needs", frozenset(self.needs))
        if not callable(self.invariances):
            object.__setattr__(self, "invariances", frozenset(self.invariances))

    def invariances_for(self, params: Any = None) -> FrozenSet[str]:
        """The declared invariances under ``params`` (the defaults when None)."""
        inv = self.invariances
        if callable(inv):
            inv = inv(params if params is not None else self.build())
        return frozenset(inv)


class Registry(registry.Registry[Variant]):
    """A :class:`harness.registry.Registry` of :class:`Variant` records: ``register(name, params=...,
    grouped=..., needs=..., aggregation=..., invariances=...)``."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind, entry=Variant)

    def requires_groups(self, name: str) -> bool:
        """True if ``name`` was registered with ``grouped=True`` (raises as :meth:`spec`)."""
        return self.spec(name).grouped
