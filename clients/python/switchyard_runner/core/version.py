"""Lenient version parsing (the part of the core's ``version.rs`` packs need).

``1.2.0``, ``v18.2``, ``20``, ``3.12.0rc1`` and ``2.34.1.windows.1`` all read as versions; text
with no leading number does not.
"""

from __future__ import annotations

import re

_U64_MAX = 2**64 - 1


def parse_lenient(text: str) -> tuple[int, int, int, str] | None:
    """``(major, minor, patch, pre)`` read leniently from ``text``; ``None`` if no leading number."""
    t = text.strip()
    if t[:1] in ("v", "V"):
        t = t[1:]
    nums = [0, 0, 0]
    count = 0
    rest = t
    pre = ""
    while True:
        m = re.match(r"[0-9]+", rest)
        if not m:
            if count == 0:
                return None
            break
        n = int(m.group(0))
        if n > _U64_MAX:
            return None
        if count < 3:
            nums[count] = n
        count += 1
        rest = rest[m.end() :]
        if rest[:1] == "." and rest[1:2].isdigit() and rest[1:2].isascii():
            rest = rest[1:]
        elif rest[:1] == "-":
            pre = rest[1:]
            break
        elif rest[:1] in ("+", ""):
            break
        else:
            pre = rest.lstrip(".")
            break
    return nums[0], nums[1], nums[2], pre.split("+")[0]
