"""Moved to ``course.runtime.devices``; kept so older imports keep working."""

from course.runtime.devices import DEVICES, DevicePeak, lookup  # noqa: F401
