"""mini_vllm: a small, numpy-only engine that makes vLLM V1's scheduling decisions.

Every module mirrors one upstream file and says which (see README.md). Importing this package
never imports torch or vllm; ``mini_vllm.testing.real_vllm`` does, lazily, for the
differential tests and the benchmark.
"""

from .block_pool import (
    NONE_HASH,
    BlockHashToBlockMap,
    BlockPool,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    hash_block_tokens,
)
from .config import CacheConfig, SchedulerConfig, SpeculativeConfig, VllmConfig, create_engine_config
from .cudagraph import (
    GraphEntry,
    GraphRunner,
    LaunchCounter,
    PiecewiseGraphRunner,
    default_capture_sizes,
    run_eager,
    select_capture_size,
)
from .engine import LLMEngine
from .kv_cache import KVCacheManager, PrefixCacheStats
from .model import ToyModel
from .outputs import RequestOutput
from .request import Request, RequestStatus
from .sampler import Sampler
from .sampling_params import SamplingParams
from .scheduler import Scheduler, SchedulerOutput
from .tokenizer import ByteTokenizer

__all__ = [
    "NONE_HASH",
    "BlockHashToBlockMap",
    "BlockPool",
    "ByteTokenizer",
    "CacheConfig",
    "FreeKVCacheBlockQueue",
    "GraphEntry",
    "GraphRunner",
    "KVCacheBlock",
    "KVCacheManager",
    "LLMEngine",
    "LaunchCounter",
    "PiecewiseGraphRunner",
    "PrefixCacheStats",
    "Request",
    "RequestOutput",
    "RequestStatus",
    "Sampler",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "SpeculativeConfig",
    "SchedulerOutput",
    "ToyModel",
    "VllmConfig",
    "create_engine_config",
    "default_capture_sizes",
    "hash_block_tokens",
    "run_eager",
    "select_capture_size",
]
