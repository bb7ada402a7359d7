"""What a study's training precision asks of the CPU that runs it.

A study fixes ``train.precision`` for every arm in its registration. ``bf16-autocast`` pays only
where the CPU computes bf16 matmuls natively (the x86 flags ``avx512_bf16`` or ``amx_bf16``): there a
bf16 matmul ran at 4.3-4.4x fp32, elsewhere 4x (Intel Xeon without them) to 100x (AMD Zen 3)
slower (``docs/benchmarks.md``). So a CPU study that trains in bf16-autocast refuses to launch on a
CPU without those flags, read from ``/proc/cpuinfo`` when it launches
(:func:`harness.runtime.provenance.cpu_bf16_flags`), and its report names the precision and the flags the
runs recorded (``provenance.machine.cpu_bf16``).
"""

from __future__ import annotations

from harness.runtime.provenance import BF16_FLAGS, cpu_bf16_flags

NATIVE_BF16 = "bf16-autocast"  # the train.precision values that need native bf16 on a CPU


def _value(overrides: list[str], key: str, default: str) -> str:
    """The last ``key=value`` of ``overrides`` (Hydra's order: a later one wins), else ``default``."""
    out = default
    for o in overrides:
        k, sep, v = str(o).lstrip("+").partition("=")
        if sep and k == key:
            out = v
    return out


def arm_precisions(spec: dict) -> dict[str, str]:
    """``{arm: train.precision}`` as each arm's overrides (``base`` then the arm's) set it (``fp32``:
    the default of :class:`harness.launch.config.TrainConfig`)."""
    return {arm: _value([*spec["base"], *o], "train.precision", "fp32") for arm, o in spec["arms"].items()}


def on_cpu(spec: dict) -> bool:
    """Whether the study's runs train on the CPU (not its ``gpu`` arm set, no ``model.device=cuda``)."""
    devices = {_value([*spec["base"], *o], "model.device", "cpu") for o in spec["arms"].values()}
    return spec.get("variant", "cpu") != "gpu" and not any(d.startswith("cuda") for d in devices)


def check_native_bf16(spec: dict, flags: list[str] | None = None, error=ValueError) -> None:
    """Refuse a CPU study with an arm at ``train.precision=bf16-autocast`` on a CPU without native bf16.

    Args:
        flags: the CPU's native-bf16 flags (:func:`harness.runtime.provenance.cpu_bf16_flags`, read now when None).
        error: the exception class raised (the study command's ``StudyError``).
    Raises:
        ``error``: naming the arms, the precision and the flags the CPU lacks.
    """
    arms = [a for a, p in arm_precisions(spec).items() if p == NATIVE_BF16]
    if not arms or not on_cpu(spec):
        return
    flags = cpu_bf16_flags() if flags is None else flags
    if not flags:
        raise error(f"{spec.get('file', spec['name'])}: arms {arms} train with train.precision={NATIVE_BF16}, "
                    f"which needs a CPU with native bf16 (flag {' or '.join(BF16_FLAGS)} in /proc/cpuinfo); this "
                    "CPU has neither, so its bf16 matmuls would run 4-100x slower than fp32: run the study on a CPU "
                    "with one of those flags")


def precision_line(spec: dict, recorded_flags: list[str]) -> str | None:
    """The report's line naming the arms' precision and the CPU bf16 flags the runs recorded; None
    for a study that trains every arm in fp32."""
    precisions = arm_precisions(spec)
    if set(precisions.values()) == {"fp32"}:
        return None
    arms = ", ".join(f"`{a}` {p}" for a, p in precisions.items())
    flags = ", ".join(sorted(set(recorded_flags))) or "not recorded"
    return f"precision (`train.precision`): {arms}; the runs' CPU bf16 flags (`machine.cpu_bf16`): {flags}"
