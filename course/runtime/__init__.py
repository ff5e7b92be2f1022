"""What labs and tests import: the lab harness, the GPU peak table, the pinned-tree helper, the bench
helper, and the drivers of the real vLLM (``real_vllm``, ``engine``).

Learner-facing and small on purpose; the maintainer tools (check-labs, grade, book, citations,
outputs, upstream) live in ``course/`` and are never imported by a lab.
"""

from course.runtime.harness import lab_module, load_lab, use_lab

__all__ = ["lab_module", "load_lab", "use_lab"]
