"""One name -> implementation registry for every pluggable piece of the harness.

Advantage estimators, policy losses, aggregations, filters and corrections (:mod:`harness.algo`),
tasks (:mod:`harness.tasks`), rollout backends (:mod:`harness.rollout`) and verifier kinds
(:mod:`harness.verifiers.batch`) all register the same way: a function or class, under a config
string, with its **params dataclass** beside it. That dataclass is declared once and is

* the Hydra structured-config node of that choice (:func:`harness.launch.config.group_schemas` reads it
  from the registry, so ``task=arith`` selects it and a misspelt key fails at startup);
* the only place the choice's defaults live (the function or class has none of its own);
* what the function receives, whole (:meth:`Entry.build`), never a filtered set of keys::

    TASKS = Registry("task")

    @dataclass
    class ArithTaskConfig(TaskConfig):
        name: str = "arith"
        digits: int = 2

    @TASKS.register("arith", params=ArithTaskConfig)
    class ArithTask(Task): ...

    task = TASKS.get(cfg.task.name)(cfg.task)

An entry also carries what its choice declares (:class:`Entry`: the inputs it ``needs``, whether
it is ``grouped``, ...), so the code that uses it reads declarations and never names a variant.
A run builds each configured choice once, as a :class:`Choice` (record and params), and calls it.

A package whose modules register themselves calls :func:`import_package_modules` once, so that
dropping a module into it registers the module's entries: there is no list of modules to edit.

Nothing here imports torch (the verifier kinds register here too).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Mapping, Optional, TypeVar

F = TypeVar("F", bound=Callable)


@dataclass(frozen=True)
class Entry:
    """One registered choice: its function or class, its params dataclass and its declarations.

    ``name_field`` is the params field that holds the choice's name (``name`` for most,
    ``backend`` for the rollout backends, whose key is ``rollout.backend``).

    The declarations, each read by the code that uses that registry (all default to "none"):

    * ``needs``: extra inputs the caller must compute (an estimator's ``"values"`` or
      ``"step_rewards"``, a correction's ``"advantages"``, the ``kl.*`` keys a controller reads);
    * ``grouped``: it needs groups of ``G >= 2`` completions per prompt (estimators);
    * ``outcome``: an outcome estimator's own function, ``(rewards [P, G], valid [P, G], p,
      state) -> [P, G]``, of which ``fn`` is the token form
      (:func:`harness.algo.estimators.outcome_estimator`);
    * ``aggregation``: the ``loss_agg`` mode the variant's source prescribes (policy losses);
    * ``invariances``: the exact properties it promises (names, or ``fn(params) -> names``),
      which ``tests/test_properties.py`` checks for every registered variant;
    * ``ratio_params``: the params that act only through the ratio ``pi / pi_old`` (policy
      losses): where every ratio is 1 (``mu=1`` on-policy) they change no update, and startup
      warns when a run sets one away from its default there (:mod:`harness.launch.validate`).
    """

    name: str
    fn: Callable
    params: Optional[type] = None
    name_field: str = "name"
    needs: FrozenSet[str] = frozenset()
    grouped: bool = False
    outcome: Optional[Callable] = None
    aggregation: Optional[str] = None
    invariances: Any = frozenset()
    ratio_params: FrozenSet[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "needs", frozenset(self.needs))
        object.__setattr__(self, "ratio_params", frozenset(self.ratio_params))
        unknown = sorted(self.ratio_params - set(self.param_names()))
        if unknown:
            raise ValueError(f"{self.name}: ratio_params {unknown} are not fields of its params")
        if not callable(self.invariances):
            object.__setattr__(self, "invariances", frozenset(self.invariances))

    def invariances_for(self, params: Any = None) -> FrozenSet[str]:
        """The declared invariances under ``params`` (the defaults when None)."""
        inv = self.invariances
        if callable(inv):
            inv = inv(params if params is not None else self.build())
        return frozenset(inv)

    def param_names(self) -> List[str]:
        """Names of the tunable fields (the name field excluded)."""
        if self.params is None:
            return []
        return [f.name for f in dataclasses.fields(self.params) if f.name != self.name_field]

    def build(self, values: Any = None, **overrides: Any) -> Any:
        """A params instance from ``values`` (a mapping, a DictConfig or an instance) and overrides.

        Missing fields take the dataclass defaults. Every key must be a field.

        Raises:
            ValueError: a key that is not a field of this entry's params (lists the accepted
                ones), or a name field naming another entry.
        """
        if self.params is None:
            if overrides or (values and any(k != self.name_field for k in dict(values))):
                given = sorted(set(overrides) | {k for k in dict(values or {}) if k != self.name_field})
                raise ValueError(f"unknown parameter(s) {given} for {self.name!r}; accepted: none")
            return None
        if isinstance(values, self.params):
            data = dataclasses.asdict(values)
        else:
            data = dict(values or {})
        data.update(overrides)
        if data.get(self.name_field, self.name) != self.name:
            raise ValueError(f"params named {data[self.name_field]!r} passed to {self.name!r}")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(self.params)})
        if unknown:
            raise ValueError(f"unknown parameter(s) {unknown} for {self.name!r}; accepted: "
                             f"{self.param_names() or 'none'}")
        return self.params(**data)


class Registry:
    """Mapping from config names to :class:`Entry` records: the one registry class of the harness.

    Args:
        kind: what is registered, for error messages (``"task"``, ``"advantage estimator"``).
        name_field: the params field holding the name (see :class:`Entry`).

    Raises (from methods):
        ValueError: ``register`` with an empty or already-used name, or a params class whose
            name field defaults to another name; ``get``/``spec`` with an unknown name (the
            message lists the valid names).
    """

    def __init__(self, kind: str, *, name_field: str = "name") -> None:
        self.kind = kind
        self.name_field = name_field
        self._items: Dict[str, Entry] = {}

    def register(self, name: str, *, params: Optional[type] = None, **declarations: Any) -> Callable[[F], F]:
        """Decorator registering a function or class under ``name`` and returning it unchanged.

        Args:
            params: the params dataclass (also the config schema); its name field, if any, must
                default to ``name``.
            declarations: the :class:`Entry` declarations (``needs``, ``grouped``, ``outcome``,
                ``aggregation``, ``invariances``, ``ratio_params``).
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if params is not None:
            fields = {f.name: f for f in dataclasses.fields(params)}
            if self.name_field in fields and fields[self.name_field].default != name:
                raise ValueError(f"{params.__name__}.{self.name_field} defaults to "
                                 f"{fields[self.name_field].default!r}, but it is registered as {self.kind} {name!r}")

        def decorator(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = Entry(name, fn, params, self.name_field, **declarations)
            return fn

        return decorator

    def spec(self, name: str) -> Entry:
        """The record registered as ``name``.

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
        """The function or class registered as ``name`` (raises as :meth:`spec`)."""
        return self.spec(name).fn

    def requires_groups(self, name: str) -> bool:
        """True if ``name`` was registered with ``grouped=True`` (raises as :meth:`spec`)."""
        return self.spec(name).grouped

    def names(self) -> List[str]:
        """Sorted list of registered names."""
        return sorted(self._items)

    def schemas(self) -> Mapping[str, type]:
        """``{name: params dataclass}`` for every entry that declares params, sorted by name."""
        return {n: v.params for n, v in sorted(self._items.items()) if v.params is not None}

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


@dataclass(frozen=True)
class Choice:
    """One configured choice: its registry record and its params instance, built once.

    Calling it calls the registered function with the params last: ``spec.fn(*inputs, params)``.
    """

    spec: Entry
    params: Any

    @classmethod
    def build(cls, registry: Registry, node: Any) -> "Choice":
        """The choice ``node.name`` of ``registry`` with params built from ``node`` (a config node).

        Raises:
            ValueError: an unknown name (lists the valid ones) or a key that is not a param.
        """
        spec = registry.spec(node.name)
        return cls(spec, spec.build(node))

    @property
    def name(self) -> str:
        return self.spec.name

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        """The registered function on ``inputs``, with its params: ``spec.fn(*inputs, params, **kwargs)``."""
        return self.spec.fn(*inputs, self.params, **kwargs)


def import_package_modules(package: str) -> List[str]:
    """Import every module of ``package`` (not its subpackages' modules; names starting with
    ``_`` skipped), so that the entries they register exist; returns the module names imported.

    Dynamic by design: this is what makes "add a module" the whole of adding a task or a backend.
    """
    pkg = importlib.import_module(package)
    names = [f"{package}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_")]
    for name in sorted(names):
        importlib.import_module(name)
    return sorted(names)
