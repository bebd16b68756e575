"""Deterministic mapping of Containerlab names to names the substrate can use.

Containerlab node names may be long and use capitals, ``-``, ``.``, ``_`` and ``|``; a node name
here is 1-12 lowercase letters and digits (it becomes part of namespace and file names).
Interface names must be valid Linux names of at most 15 bytes (``IFNAMSIZ`` - 1) and not the
substrate's own (``lo``, ``sr0``). A name that fits is kept; ``PC1`` becomes ``pc1``; any other
becomes a readable stem plus five hex digits of the SHA-1 of the original name, so the same
file always gives the same names, whatever else is in it. ``harness lab show`` lists both.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter

from substrate.topology import IFNAME_RE, NODE_NAME_RE, RESERVED_IFNAMES

NODE_MAX = 12
IFNAME_MAX = 15
_HASH = 5


def _digest(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:_HASH]


def node_candidate(name: str) -> str:
    """The plain mapping of a node name: lowercase, letters and digits only, starting with a letter."""
    c = re.sub(r"[^a-z0-9]", "", name.lower())
    return c if c[:1].isalpha() else f"n{c}"


def hashed_node(name: str) -> str:
    """The hashed form: ``<stem><5 hex>``, 12 characters at most."""
    return node_candidate(name)[: NODE_MAX - _HASH] + _digest(name)


def map_nodes(names: list[str]) -> dict[str, str]:
    """Original node name -> node name. Candidates that are too long or collide take the hashed
    form. Raises ValueError in the (astronomically unlikely) case that two still collide."""
    cands = {n: node_candidate(n) for n in names}
    counts = Counter(cands.values())
    out = {}
    for n in names:
        c = cands[n]
        out[n] = c if counts[c] == 1 and re.fullmatch(NODE_NAME_RE, c) else hashed_node(n)
    clash = [v for v, k in Counter(out.values()).items() if k > 1]
    if clash:
        raise ValueError(f"node names {sorted(n for n in names if out[n] in clash)} map to the same name {clash[0]!r}")
    return out


def interface_ok(name: str) -> bool:
    """``name`` can be used as it is."""
    return bool(re.fullmatch(IFNAME_RE, name)) and name not in RESERVED_IFNAMES


def map_interface(name: str) -> str:
    """Interface name -> a valid one: itself when it fits, else ``<stem>-<5 hex>`` (15 at most)."""
    if interface_ok(name):
        return name
    stem = re.sub(r"[^A-Za-z0-9_.-]", "", name)
    if not stem[:1].isalpha():
        stem = "e" + stem
    return f"{stem[: IFNAME_MAX - _HASH - 1]}-{_digest(name)}"
