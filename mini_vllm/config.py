"""Engine configuration: one home per setting, validated once, when the object is built.

Mirrors ``vllm/config/cache.py`` (``CacheConfig``), ``vllm/config/scheduler.py``
(``SchedulerConfig``, ``verify_max_model_len``), ``vllm/config/parallel.py`` (``ParallelConfig``),
``vllm/config/lora.py`` (``LoRAConfig``), ``vllm/config/speculative.py`` (``SpeculativeConfig``),
``vllm/config/model.py`` (``ModelConfig``) and ``vllm/config/vllm.py`` (``VllmConfig``, the object
every component receives), with the startup check of ``vllm/v1/core/kv_cache_utils.py``
(``check_enough_kv_cache_memory``: one request of ``max_model_len`` tokens must fit the pool).
``create_engine_config`` plays ``EngineArgs.create_engine_config``: flat keyword arguments in,
one validated ``VllmConfig`` out; components never re-check what is checked here. Every rule,
with upstream's where upstream has one, is in README.md ("Configuration").

Left out: every proposer but n-gram, the rejection sampler's "synthetic" mode, pipeline, data
and context parallelism, Ray, devices, memory fractions, dtypes other than float32, swap space,
and upstream's ``max_num_batched_tokens >= max_num_seqs`` rule (mini accepts a budget smaller
than the seat count; the budget then bounds the batch first).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


@dataclass(frozen=True)
class CacheConfig:
    """The KV pool: how many blocks, how many tokens each, prefix caching on or off."""

    block_size: int = 16
    num_gpu_blocks: int = 257  # counts the null block: num_gpu_blocks - 1 blocks hold KV
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        _check_int("block_size", self.block_size, 1)
        _check_int("num_gpu_blocks", self.num_gpu_blocks, 2)
        _check_bool("enable_prefix_caching", self.enable_prefix_caching)

    @property
    def num_usable_tokens(self) -> int:
        """Tokens the non-null blocks hold: the largest ``max_model_len`` that fits."""
        return (self.num_gpu_blocks - 1) * self.block_size


@dataclass(frozen=True)
class SchedulerConfig:
    """The step budget: seats, tokens per step, chunking, and the longest sequence."""

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: what the KV pool holds (VllmConfig fills it in)
    long_prefill_token_threshold: int = 0  # 0 = off
    enable_chunked_prefill: bool = True
    max_num_encoder_input_tokens: int = 0  # encoder compute budget per step, in embeddings (0: text only)
    encoder_cache_size: int = 0  # encoder cache capacity, in embeddings
    disable_chunked_mm_input: bool = False  # never end a chunk inside an image it started before

    def __post_init__(self) -> None:
        _check_int("max_num_encoder_input_tokens", self.max_num_encoder_input_tokens, 0)
        _check_int("encoder_cache_size", self.encoder_cache_size, 0)
        _check_bool("disable_chunked_mm_input", self.disable_chunked_mm_input)
        _check_int("max_num_seqs", self.max_num_seqs, 1)
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _check_int("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        _check_bool("enable_chunked_prefill", self.enable_chunked_prefill)
        if self.max_model_len is not None:
            _check_int("max_model_len", self.max_model_len, 2)
            self.verify_max_model_len(self.max_model_len)

    def verify_max_model_len(self, max_model_len: int) -> None:
        if self.max_num_batched_tokens < max_model_len and not self.enable_chunked_prefill:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({max_model_len}). This effectively limits the maximum sequence "
                "length to max_num_batched_tokens and makes vLLM reject longer sequences. Please "
                "increase max_num_batched_tokens or decrease max_model_len."
            )


EXECUTOR_BACKENDS = ("uni", "mp")


@dataclass(frozen=True)
class ParallelConfig:
    """How many tensor-parallel ranks, and where their workers live."""

    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # None: "uni" at TP=1, "mp" above

    def __post_init__(self) -> None:
        _check_int("tensor_parallel_size", self.tensor_parallel_size, 1)
        backend = self.distributed_executor_backend
        if backend is None:
            backend = "uni" if self.tensor_parallel_size == 1 else "mp"
            object.__setattr__(self, "distributed_executor_backend", backend)
        if backend not in EXECUTOR_BACKENDS:
            raise ValueError(
                f"distributed_executor_backend must be one of {EXECUTOR_BACKENDS} or None, got {backend!r}"
            )
        if backend == "uni" and self.tensor_parallel_size != 1:
            raise ValueError(
                f"the 'uni' backend runs one worker in the engine's process; tensor_parallel_size="
                f"{self.tensor_parallel_size} needs distributed_executor_backend='mp'"
            )

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size  # no pipeline parallelism


@dataclass(frozen=True)
class LoRAConfig:
    """Multi-LoRA (``vllm/config/lora.py``): at most ``max_loras`` distinct adapters per step."""

    max_loras: int = 1
    max_lora_rank: int = 16

    def __post_init__(self) -> None:
        _check_int("max_loras", self.max_loras, 1)
        _check_int("max_lora_rank", self.max_lora_rank, 1)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding with the n-gram (prompt-lookup) proposer: how many drafts, which n."""

    method: str = "ngram"
    num_speculative_tokens: int | None = None  # required
    prompt_lookup_min: int | None = None  # None: copies prompt_lookup_max, or 5 when both are None
    prompt_lookup_max: int | None = None

    def __post_init__(self) -> None:
        if self.method == "[ngram]":
            object.__setattr__(self, "method", "ngram")
        if self.method != "ngram":
            raise ValueError(f"mini_vllm speculates with method='ngram' only, got method={self.method!r}")
        if self.num_speculative_tokens is None:
            raise ValueError("num_speculative_tokens must be provided with the ngram method")
        _check_int("num_speculative_tokens", self.num_speculative_tokens, 1)
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        for name, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if value is not None:
                _check_int(name, value, 1)
        if lo is None and hi is None:
            lo = hi = 5
        elif lo is None:
            lo = hi
        elif hi is None:
            hi = lo
        assert lo is not None and hi is not None
        if lo > hi:
            raise ValueError(f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
        object.__setattr__(self, "prompt_lookup_min", lo)
        object.__setattr__(self, "prompt_lookup_max", hi)

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots reserved past the scheduled tokens (upstream: ``Scheduler.num_lookahead_tokens``).

        Only proposers that run a model on the draft positions (EAGLE, MTP, draft models) need
        them, for the KV they write while drafting; n-gram drafts cost no KV, so 0. The drafts
        themselves get slots because they are scheduled tokens.
        """
        return 0


@dataclass(frozen=True)
class KVTransferConfig:
    """``vllm/config/kv_transfer.py`` (``KVTransferConfig``): which connector, which role, its extras.

    ``kv_role`` is ``"kv_producer"`` (saves), ``"kv_consumer"`` (loads) or ``"kv_both"``, upstream's
    three roles; ``kv_connector_extra_config`` reaches the connector untouched (``shared_storage_path``,
    and mini's ``load_async`` / ``load_delay_steps``).
    """

    kv_connector: str = "ExampleConnector"
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.kv_connector, str) or not self.kv_connector:
            raise ValueError(f"kv_connector must be a connector name, got {self.kv_connector!r}")
        if self.kv_role not in ("kv_producer", "kv_consumer", "kv_both"):
            raise ValueError(
                f"kv_role must be one of 'kv_producer', 'kv_consumer', 'kv_both', got {self.kv_role!r}"
            )
        if not isinstance(self.kv_connector_extra_config, dict):
            raise TypeError("kv_connector_extra_config must be a dict")

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")


@dataclass(frozen=True)
class VllmConfig:
    """Everything one engine is built from; ``scheduler_config.max_model_len`` is always set."""

    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    lora_config: LoRAConfig | None = None  # None: LoRA off (upstream: enable_lora=False)
    speculative_config: SpeculativeConfig | None = None  # None: no speculative decoding
    model_config: ModelConfig | None = None  # None: the toy model (ToyForCausalLM, byte tokenizer)
    kv_transfer_config: KVTransferConfig | None = None  # None: no KV connector (Phase 15)

    def __post_init__(self) -> None:
        if isinstance(self.kv_transfer_config, dict):  # the engine-argument spelling
            object.__setattr__(self, "kv_transfer_config", KVTransferConfig(**self.kv_transfer_config))
        if self.kv_transfer_config is not None and not isinstance(self.kv_transfer_config, KVTransferConfig):
            raise TypeError(
                "kv_transfer_config must be a KVTransferConfig, a dict or None, "
                f"got {type(self.kv_transfer_config).__name__}"
            )
        if self.model_config is not None and not isinstance(self.model_config, ModelConfig):
            raise TypeError(f"model_config must be a ModelConfig or None, got {type(self.model_config).__name__}")
        if self.lora_config is not None and not isinstance(self.lora_config, LoRAConfig):
            raise TypeError(
                f"lora_config must be a LoRAConfig or None, got {type(self.lora_config).__name__}"
            )
        if isinstance(self.speculative_config, dict):  # the engine-argument spelling
            object.__setattr__(self, "speculative_config", SpeculativeConfig(**self.speculative_config))
        if self.speculative_config is not None and not isinstance(self.speculative_config, SpeculativeConfig):
            raise TypeError(
                "speculative_config must be a SpeculativeConfig, a dict or None, "
                f"got {type(self.speculative_config).__name__}"
            )
        if not isinstance(self.cache_config, CacheConfig):
            raise TypeError(f"cache_config must be a CacheConfig, got {type(self.cache_config).__name__}")
        if not isinstance(self.scheduler_config, SchedulerConfig):
            raise TypeError(
                f"scheduler_config must be a SchedulerConfig, got {type(self.scheduler_config).__name__}"
            )
        if not isinstance(self.parallel_config, ParallelConfig):
            raise TypeError(
                f"parallel_config must be a ParallelConfig, got {type(self.parallel_config).__name__}"
            )
        cache, sched = self.cache_config, self.scheduler_config
        capacity = cache.num_usable_tokens
        model_len = self.model_config.max_model_len if self.model_config is not None else None
        if sched.max_model_len is None:
            default = capacity if model_len is None else min(capacity, model_len)
            sched = replace(sched, max_model_len=default)  # re-runs its checks
            object.__setattr__(self, "scheduler_config", sched)
        assert sched.max_model_len is not None
        mc = self.model_config
        if mc is not None and not mc.is_chunked_prefill_supported:  # upstream warns; mini refuses
            on = [n for n, v in (("enable_chunked_prefill", sched.enable_chunked_prefill),
                                 ("enable_prefix_caching", cache.enable_prefix_caching)) if v]
            if on:
                raise ValueError(f"{' and '.join(on)}: {mc.pooler_config.seq_pooling_type} pooling reads every "
                                 "prompt row in one step; leave them unset (off for this model) or set False")
        if model_len is not None and sched.max_model_len > model_len:
            raise ValueError(f"max_model_len {sched.max_model_len} is greater than the model's {model_len}")
        if sched.max_model_len > capacity:
            needed = -(-sched.max_model_len // cache.block_size)
            raise ValueError(
                f"To serve at least one request with the model's max seq len ({sched.max_model_len}), "
                f"{needed} KV blocks of {cache.block_size} tokens are needed, which is more than the "
                f"{cache.num_gpu_blocks - 1} usable blocks of the pool (num_gpu_blocks="
                f"{cache.num_gpu_blocks} counts the null block). Based on the available blocks, the "
                f"estimated maximum model length is {capacity}. Try increasing num_gpu_blocks or "
                f"decreasing max_model_len."
            )

    @property
    def max_model_len(self) -> int:
        assert self.scheduler_config.max_model_len is not None
        return self.scheduler_config.max_model_len


_CACHE_FIELDS = {f.name for f in fields(CacheConfig)}
_SCHEDULER_FIELDS = {f.name for f in fields(SchedulerConfig)}
_PARALLEL_FIELDS = {f.name for f in fields(ParallelConfig)}


_LORA_FIELDS = {f.name for f in fields(LoRAConfig)}


def create_engine_config(**engine_args: Any) -> VllmConfig:
    """Flat keyword arguments (``block_size=4, max_num_seqs=2, ...``) → one ``VllmConfig``.

    ``enable_lora=True`` builds a ``LoRAConfig`` from ``max_loras`` / ``max_lora_rank``; those two
    without ``enable_lora=True`` are refused (upstream ignores them silently). ``speculative_config``
    is a dict (``{"method": "ngram", "num_speculative_tokens": 3}``, as upstream's ``EngineArgs``), a
    ``SpeculativeConfig`` or ``None``; ``kv_transfer_config`` likewise (a dict or a ``KVTransferConfig``).
    ``model`` (a checkpoint directory) builds a ``ModelConfig``.
    """
    enable_lora = engine_args.pop("enable_lora", False)
    _check_bool("enable_lora", enable_lora)
    speculative = engine_args.pop("speculative_config", None)
    kv_transfer = engine_args.pop("kv_transfer_config", None)
    model = engine_args.pop("model", None)
    model_args = {k: engine_args.pop(k) for k in ("runner", "pooler_config") if k in engine_args}
    if isinstance(model_args.get("pooler_config"), dict):
        model_args["pooler_config"] = PoolerConfig(**model_args["pooler_config"])
    if model_args and model is None:
        raise ValueError(f"{sorted(model_args)} need a model checkpoint (model=...)")
    fields = _CACHE_FIELDS | _SCHEDULER_FIELDS | _PARALLEL_FIELDS | _LORA_FIELDS
    unknown = sorted(set(engine_args) - fields)
    if unknown:
        known = ", ".join(
            sorted(fields | {"enable_lora", "speculative_config", "kv_transfer_config", "model", "runner", "pooler_config"})
        )
        raise TypeError(f"unknown engine argument(s) {unknown}; known: {known}")
    lora_args = {k: v for k, v in engine_args.items() if k in _LORA_FIELDS}
    if lora_args and not enable_lora:
        raise ValueError(f"{sorted(lora_args)} given without enable_lora=True")
    cache = CacheConfig(**{k: v for k, v in engine_args.items() if k in _CACHE_FIELDS})
    sched_args = {k: v for k, v in engine_args.items() if k in _SCHEDULER_FIELDS}
    # The model caps max_model_len at its max_position_embeddings (a larger one is refused); unset,
    # VllmConfig makes it the smaller of that and what the pool holds.
    model_config = (
        None if model is None else ModelConfig(model=model, max_model_len=sched_args.get("max_model_len"), **model_args)
    )
    if model_config is not None:  # EngineArgs._set_default_chunked_prefill_and_prefix_caching_args
        sched_args.setdefault("enable_chunked_prefill", model_config.is_chunked_prefill_supported)
        if "enable_prefix_caching" not in engine_args and not model_config.is_prefix_caching_supported:
            cache = replace(cache, enable_prefix_caching=False)
    return VllmConfig(
        cache,
        SchedulerConfig(**sched_args),
        parallel_config=ParallelConfig(**{k: v for k, v in engine_args.items() if k in _PARALLEL_FIELDS}),
        lora_config=LoRAConfig(**lora_args) if enable_lora else None,
        speculative_config=speculative,
        model_config=model_config,
        kv_transfer_config=kv_transfer,
    )


_MODEL_DTYPES = ("float32",)
SEQ_POOLING_TYPES = ("CLS", "LAST", "MEAN")


@dataclass(frozen=True)
class PoolerConfig:
    """How a pooling model pools (vllm/config/pooler.py:21 — PoolerConfig): ``seq_pooling_type``
    is ``"LAST"``, ``"MEAN"`` or ``"CLS"``; ``None`` keeps the model class's default (``"LAST"``)."""

    seq_pooling_type: str | None = None

    def __post_init__(self) -> None:
        if self.seq_pooling_type is not None and self.seq_pooling_type not in SEQ_POOLING_TYPES:
            raise ValueError(
                f"seq_pooling_type must be one of {SEQ_POOLING_TYPES} or None, got {self.seq_pooling_type!r}"
            )


@dataclass(frozen=True)
class ModelConfig:
    """The model a checkpoint directory describes (vllm/config/model.py:117 — ModelConfig).

    ``ModelConfig(model="build/tiny-llama")`` reads ``model/config.json`` into ``hf_config`` (a
    plain dict) and derives: ``architectures`` (what ``ModelRegistry`` resolves), ``vocab_size``,
    ``eos_token_ids`` (``eos_token_id`` may be one id or a list; ``eos_token_id`` is the first),
    ``max_position_embeddings`` and ``max_model_len``: the given one, or the model's
    ``max_position_embeddings`` when not given; asking for more is refused, as
    vllm/config/model.py:2119 — _get_and_verify_max_len does. ``hf_config=`` instead of a directory describes a model that
    has no files (the toy: ``{"architectures": ["ToyForCausalLM"], "vocab_size": 257}``).
    ``dtype`` is ``"float32"`` only: mini's numpy models compute in float32.
    Left out: the hub, revisions, ``trust_remote_code``, generation_config.json, RoPE-scaling
    length rules, sliding windows, quantization, runner / convert types, multimodal settings.
    ``pooler_config`` chooses a pooling model's pooling (``get_model`` passes it on); it turns
    chunked prefill and prefix caching off for MEAN and CLS, as upstream's rules do.
    """

    model: Any = None
    max_model_len: int | None = None
    dtype: str = "float32"
    hf_config: dict[str, Any] | None = None
    pooler_config: PoolerConfig | None = None  # a pooling model's pooling (None: its default)
    runner: str = "auto"  # "generate", "pooling", or "auto": what the registry says the class does

    def __post_init__(self) -> None:
        import json
        from pathlib import Path

        if self.runner not in ("auto", "generate", "pooling"):
            raise ValueError(f"runner must be 'auto', 'generate' or 'pooling', got {self.runner!r}")
        if self.pooler_config is not None and not isinstance(self.pooler_config, PoolerConfig):
            raise TypeError(
                f"pooler_config must be a PoolerConfig or None, got {type(self.pooler_config).__name__}"
            )
        if self.dtype not in _MODEL_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not supported; mini_vllm computes in {_MODEL_DTYPES}")
        hf_config = self.hf_config
        if hf_config is None:
            if self.model is None:
                raise ValueError("ModelConfig needs a model directory (model=...) or an hf_config dict")
            path = Path(self.model)
            if not path.is_dir():
                raise FileNotFoundError(f"model directory {str(path)!r} does not exist")
            config_file = path / "config.json"
            if not config_file.is_file():
                raise FileNotFoundError(
                    f"{str(path)!r} has no config.json: not a Hugging Face model directory"
                )
            try:
                hf_config = json.loads(config_file.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise ValueError(f"{config_file}: not valid JSON ({exc})") from None
            object.__setattr__(self, "model", path)
        if not isinstance(hf_config, dict):
            raise TypeError(
                f"hf_config must be a dict (a parsed config.json), got {type(hf_config).__name__}"
            )
        object.__setattr__(self, "hf_config", hf_config)
        archs = hf_config.get("architectures")
        if not archs or not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise ValueError(
                f"config.json must name the model class in 'architectures' (a list of str), got {archs!r}"
            )
        vocab = hf_config.get("vocab_size")
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 2:
            raise ValueError(f"config.json's vocab_size must be an int >= 2, got {vocab!r}")
        eos = hf_config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        if not all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e < vocab for e in eos_ids):
            raise ValueError(f"config.json's eos_token_id must be ids in [0, {vocab}), got {eos!r}")
        derived = hf_config.get("max_position_embeddings")
        max_len = self.max_model_len
        if max_len is not None:
            _check_int("max_model_len", max_len, 1)
            if derived is not None and max_len > derived:
                raise ValueError(
                    f"max_model_len {max_len} is greater than the model's max_position_embeddings {derived}"
                )
        else:
            max_len = derived
        object.__setattr__(self, "max_model_len", max_len)

    @property
    def architectures(self) -> list[str]:
        return list(self.hf_config["architectures"])

    @property
    def runner_type(self) -> str:
        """``runner``, or for ``"auto"`` what the architecture's class is: ``"pooling"`` or
        ``"generate"`` (vllm/config/model.py:902 — ModelConfig._get_default_runner_type)."""
        if self.runner != "auto":
            return self.runner
        from .models.registry import ModelRegistry

        return "pooling" if ModelRegistry.is_pooling_model(self.architectures) else "generate"

    @property
    def is_chunked_prefill_supported(self) -> bool:
        """False for a causal pooling model that pools MEAN or CLS: it needs every prompt row in
        one step (vllm/config/model.py:1775 — ModelConfig.is_chunked_prefill_supported)."""
        return not (self.pooler_config is not None and self.pooler_config.seq_pooling_type in ("MEAN", "CLS"))

    @property
    def is_prefix_caching_supported(self) -> bool:
        """Same rule: a cached prefix would skip rows MEAN / CLS pooling reads
        (vllm/config/model.py:1821 — ModelConfig.is_prefix_caching_supported)."""
        return self.is_chunked_prefill_supported

    @property
    def vocab_size(self) -> int:
        return self.hf_config["vocab_size"]

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.hf_config.get("eos_token_id")
        return tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))

    @property
    def eos_token_id(self) -> int | None:
        ids = self.eos_token_ids
        return ids[0] if ids else None

    @property
    def max_position_embeddings(self) -> int | None:
        return self.hf_config.get("max_position_embeddings")
