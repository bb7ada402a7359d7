"""A tiny name -> callable registry used by every pluggable piece of ``harness.algo``.

Each advantage estimator, KL form and loss-aggregation mode is a small function
registered under a config string, e.g.::

    OUTCOME_ESTIMATORS = Registry("outcome estimator")

    @OUTCOME_ESTIMATORS.register("grpo")
    def _grpo(rewards, valid, **params): ...

    fn = OUTCOME_ESTIMATORS.get(cfg.algo.estimator)

Selecting by name replaces if-chains; unknown names fail loudly with the list of
valid names so a typo in a config is caught at validation time.
"""

from __future__ import annotations

from typing import Callable, Dict, Generic, Iterator, List, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Mapping from config names to callables.

    Args:
        kind: human-readable description of what is registered (used in error
            messages, e.g. ``"KL estimator"``).

    Raises (from methods):
        ValueError: ``register`` with an empty or already-used name;
            ``get`` with an unknown name (the message lists valid names).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: Dict[str, F] = {}
        self._grouped: set = set()

    def register(self, name: str, *, grouped: bool = False) -> Callable[[F], F]:
        """Decorator registering ``fn`` under ``name`` and returning ``fn`` unchanged.

        ``grouped=True`` marks an estimator that needs groups of ``G >= 2`` completions
        (see :meth:`requires_groups`).

        Raises:
            ValueError: if ``name`` is empty / not a string, or already registered.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = fn
            if grouped:
                self._grouped.add(name)
            return fn

        return decorator

    def get(self, name: str) -> F:
        """Return the callable registered as ``name``.

        Raises:
            ValueError: if ``name`` is unknown; the message lists the valid names.
        """
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}"
            ) from None

    def requires_groups(self, name: str) -> bool:
        """True if ``name`` was registered with ``grouped=True``.

        Raises:
            ValueError: if ``name`` is unknown (lists valid names).
        """
        self.get(name)
        return name in self._grouped

    def names(self) -> List[str]:
        """Sorted list of registered names."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
