"""mini_vllm: a small, numpy-only engine that makes vLLM V1's scheduling decisions.

Every module mirrors one upstream file and says which (see README.md). Importing this package
never imports torch or vllm; ``mini_vllm.testing.real_vllm`` does, lazily, for the
differential tests and the benchmark.
"""

from .beam_search import BeamSearchOutput, BeamSearchSequence, get_beam_search_score
from .block_pool import (
    NONE_HASH,
    BlockHashToBlockMap,
    BlockPool,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    hash_block_tokens,
)
from .config import (
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
    create_engine_config,
)
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
from .outputs import CompletionOutput, RequestOutput
from .parallel_sampling import ParentRequest
from .request import Request, RequestStatus
from .sampler import Sampler
from .sampling_params import BeamSearchParams, SamplingParams, StructuredOutputsParams
from .scheduler import Scheduler, SchedulerOutput
from .tokenizer import ByteTokenizer

__all__ = [
    "BeamSearchOutput",
    "BeamSearchParams",
    "BeamSearchSequence",
    "BlockHashToBlockMap",
    "BlockPool",
    "ByteTokenizer",
    "CacheConfig",
    "CompletionOutput",
    "FreeKVCacheBlockQueue",
    "GraphEntry",
    "GraphRunner",
    "KVCacheBlock",
    "KVCacheManager",
    "LLMEngine",
    "LaunchCounter",
    "ModelConfig",
    "NONE_HASH",
    "ParallelConfig",
    "ParentRequest",
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
    "StructuredOutputsParams",
    "ToyModel",
    "VllmConfig",
    "create_engine_config",
    "default_capture_sizes",
    "get_beam_search_score",
    "hash_block_tokens",
    "run_eager",
    "select_capture_size",
]
