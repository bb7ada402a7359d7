"""A name -> variant registry used by every pluggable piece of ``harness.algo``.

Each advantage estimator and loss-aggregation mode is a small function registered under a
config string together with its **parameter dataclass**. That dataclass is declared once and
serves three purposes:

* it is the Hydra structured-config node of that choice (``harness.config`` stores it in the
  ConfigStore, so ``advantage=grpo`` selects it and a misspelt key fails at startup);
* its field defaults are the only defaults of the variant (the function has none);
* the function receives the whole instance, never a filtered set of keys::

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

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Generic, Iterator, List, Mapping, Optional, TypeVar

F = TypeVar("F", bound=Callable)


@dataclass(frozen=True)
class Variant:
    """One registered variant: its function, parameter dataclass and declarations."""

    name: str
    fn: Callable
    params: Optional[type] = None
    grouped: bool = False
    needs: FrozenSet[str] = field(default_factory=frozenset)
    aggregation: Optional[str] = None  # the loss aggregation the variant's paper prescribes (policy losses)
    invariances: Any = frozenset()  # names, or fn(params) -> names: properties the variant promises

    def invariances_for(self, params: Any = None) -> FrozenSet[str]:
        """The declared invariances under ``params`` (the defaults when None)."""
        inv = self.invariances
        if callable(inv):
            inv = inv(params if params is not None else self.build())
        return frozenset(inv)

    def param_names(self) -> List[str]:
        """Names of the tunable fields (``name`` excluded)."""
        if self.params is None:
            return []
        return [f.name for f in dataclasses.fields(self.params) if f.name != "name"]

    def build(self, values: Any = None, **overrides: Any) -> Any:
        """A params instance from ``values`` (a mapping, a DictConfig or an instance) and overrides.

        Missing fields take the dataclass defaults. Every key must be a field.

        Raises:
            ValueError: a key that is not a field of this variant's params (lists the accepted
                ones), or a ``name`` key naming another variant.
        """
        if self.params is None:
            if overrides or (values and any(k != "name" for k in dict(values))):
                given = sorted(set(overrides) | {k for k in dict(values or {}) if k != "name"})
                raise ValueError(f"unknown parameter(s) {given} for {self.name!r}; accepted: none")
            return None
        if isinstance(values, self.params):
            data = dataclasses.asdict(values)
        else:
            data = dict(values or {})
        data.update(overrides)
        if data.get("name", self.name) != self.name:
            raise ValueError(f"params named {data['name']!r} passed to {self.name!r}")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(self.params)})
        if unknown:
            raise ValueError(f"unknown parameter(s) {unknown} for {self.name!r}; accepted: "
                             f"{self.param_names() or 'none'}")
        return self.params(**data)


class Registry(Generic[F]):
    """Mapping from config names to :class:`Variant` records.

    Args:
        kind: human-readable description of what is registered (used in error
            messages, e.g. ``"advantage estimator"``).

    Raises (from methods):
        ValueError: ``register`` with an empty or already-used name, or a params class whose
            ``name`` default differs from the registered name; ``get``/``spec`` with an unknown
            name (the message lists valid names).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: Dict[str, Variant] = {}

    def register(self, name: str, *, params: Optional[type] = None, grouped: bool = False,
                 needs: tuple = (), aggregation: Optional[str] = None,
                 invariances: Any = ()) -> Callable[[F], F]:
        """Decorator registering ``fn`` under ``name`` and returning ``fn`` unchanged.

        Args:
            params: the parameter dataclass (also the config schema); its ``name`` field, if
                any, must default to ``name``.
            grouped: the variant needs groups of ``G >= 2`` completions per prompt.
            needs: extra inputs the trainer must compute (e.g. ``("values",)``).
            aggregation: the ``loss_agg`` mode the variant's source prescribes, if any.
            invariances: the properties the variant promises (names, or ``fn(params) -> names``).
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if params is not None:
            names = {f.name: f for f in dataclasses.fields(params)}
            if "name" in names and names["name"].default != name:
                raise ValueError(f"{params.__name__}.name defaults to {names['name'].default!r}, "
                                 f"but it is registered as {self.kind} {name!r}")

        def decorator(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            inv = invariances if callable(invariances) else frozenset(invariances)
            self._items[name] = Variant(name, fn, params, grouped, frozenset(needs), aggregation, inv)
            return fn

        return decorator

    def spec(self, name: str) -> Variant:
        """The :class:`Variant` registered as ``name``.

        Raises:
            ValueError: if ``name`` is unknown; the message lists the valid names.
        """
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}"
            ) from None

    def get(self, name: str) -> Callable:
        """The function registered as ``name`` (raises as :meth:`spec`)."""
        return self.spec(name).fn

    def requires_groups(self, name: str) -> bool:
        """True if ``name`` was registered with ``grouped=True`` (raises as :meth:`spec`)."""
        return self.spec(name).grouped

    def names(self) -> List[str]:
        """Sorted list of registered names."""
        return sorted(self._items)

    def schemas(self) -> Mapping[str, type]:
        """``{name: params dataclass}`` for every variant that declares params."""
        return {n: v.params for n, v in sorted(self._items.items()) if v.params is not None}

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
