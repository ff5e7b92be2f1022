"""Course tooling for vLLM Mastery. What labs import lives in ``course.runtime`` (the lab harness,
the GPU peak table, the pinned-tree helper, the bench entry point); the rest are maintainer tools:
the upstream fetcher, the citation checker, the lab checker and its mutant deltas, the output
refresher, the grader and the book builder.

Run ``python -m course --help`` for the command list.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIN_TAG = "v0.22.1"
PIN_COMMIT = "0decac0d96c42b49572498019f0a0e3600f50398"
PIN_SHORT = "0decac0"
PIN_WHEEL_COMMIT_ID = "g0decac0d9"
VLLM_VERSION = "0.22.1"
