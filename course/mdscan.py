"""Which lines of a markdown page are inside a fenced code block (CommonMark fence rules).

A fence opens with three or more backticks or tildes and closes with a line of at least as many
of the same character and nothing else, so a ````markdown example that itself contains a
```text block is one code block, as GitHub and mdBook render it. A fence inside a blockquote
(``> ```text``) counts too.
"""

from __future__ import annotations

import re

FENCE_RE = re.compile(r"^(?:\s*>)*\s*(`{3,}|~{3,})(.*)$")


def fenced_lines(lines: list[str]) -> list[bool]:
    """``result[i]`` is True when line ``i`` is a fence line or inside a fenced block."""
    flags = []
    opener: str | None = None
    for line in lines:
        m = FENCE_RE.match(line)
        if opener is None:
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                opener = m.group(1)
                flags.append(True)
            else:
                flags.append(False)
        else:
            flags.append(True)
            if m and m.group(1)[0] == opener[0] and len(m.group(1)) >= len(opener) and not m.group(2).strip():
                opener = None
    return flags
