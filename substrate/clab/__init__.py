"""Containerlab labs on the netns substrate, without Docker: a ``.clab.yml`` file translated to the
topology model (:func:`load`), and the model written back as one (:func:`write_containerlab`,
from :mod:`substrate.export`, which the import reads back into the same model).

See :mod:`substrate.clab.translate` for what is read and what is refused.
"""

from __future__ import annotations

import re
from pathlib import Path

from substrate.clab.source import ClabError
from substrate.clab.translate import ClabImport, is_clab_file, load
from substrate.export import to_containerlab, write_containerlab
from substrate.topology import Topology, read_regular_file

__all__ = ["ClabError", "ClabImport", "from_spec", "is_clab_file", "load", "to_containerlab", "write_containerlab"]


def _looks_like_clab(path: Path) -> bool:
    """A ``*.clab.yml`` name, or a YAML file with a top-level ``topology:`` key (Containerlab's;
    anibench's own form has ``nodes``)."""
    if is_clab_file(path):
        return True
    if path.suffix not in (".yml", ".yaml"):
        return False
    try:
        head = read_regular_file(path).decode(errors="replace")
    except (OSError, ValueError):
        return False  # Topology.from_yaml says why it cannot be read
    return re.search(r"^topology\s*:", head, re.M) is not None


def from_spec(spec: str) -> ClabImport:
    """What :meth:`Topology.from_spec` reads (``grid:5x5``, a YAML topology), plus Containerlab
    topology files (``*.clab.yml``, or any YAML file with a ``topology`` mapping).

    Raises:
        TopologyError: (ClabError for a Containerlab file) in one line, see :func:`load`.
    """
    path = Path(spec)
    if _looks_like_clab(path):
        return load(path)
    return ClabImport(topology=Topology.from_spec(spec))
