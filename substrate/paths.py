"""Where the substrate keeps its runtime state on the host.

``/run/anibench`` (a tmpfs, cleared at boot together with every namespace it describes):

- ``labs/<lab>/lab.json`` -- the lab record (topology, per-node namespace and init PID);
- ``labs/<lab>/etc/`` -- the allowlisted host files every node of the lab sees as ``/etc``
  (a tmpfs; ``confine.stage_etc``);
- ``labs/<lab>/nodes/<node>/`` -- the node's private ``/etc/frr`` (a tmpfs), its hostname file
  and its root mount point;
- ``features.json`` -- this boot's kernel feature probe.

Nodes see nothing else of it: each node runs in a minimal root that only holds read-only ``/usr``
and that ``/etc`` copy plus its own private directories (see ``node_init.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Root of the runtime state. Overridable for tests with ANIBENCH_STATE_ROOT.
STATE_ROOT = Path(os.environ.get("ANIBENCH_STATE_ROOT", "/run/anibench"))
LABS_DIR = STATE_ROOT / "labs"
#: Prefix of every network namespace anibench creates; cleanup only ever touches these.
NETNS_PREFIX = "anibench-"


def lab_dir(lab: str) -> Path:
    """Directory of one lab's runtime state."""
    return LABS_DIR / lab


def netns_name(lab: str, node: str) -> str:
    """Name of a node's network namespace (``anibench-<lab>-<node>``), as listed by ``ip netns``."""
    return f"{NETNS_PREFIX}{lab}-{node}"
