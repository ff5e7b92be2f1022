"""Moved to ``course.runtime.pinned``; kept so older imports keep working."""

from course.runtime.pinned import compile_definitions  # noqa: F401
