"""Moved to ``course.runtime.harness``; kept so older imports keep working."""

from course.runtime.harness import OPTIONAL_DEPS, LabImplError, current_impl, lab_file, load_file, load_lab  # noqa: F401
