"""A Containerlab topology file read with the line of every key and item, and the one error type
of the importer, which names file, line and field.

Fields are written as Containerlab's documentation writes them (``topology.nodes.r1.binds[0]``).
YAML anchors, aliases and merge keys (``<<:``) work as in Go's yaml.v2, which Containerlab uses;
a key given twice in one mapping is an error there and here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from substrate.errors import TopologyError
from substrate.topology import MAX_FILE_BYTES, read_regular_file

#: A field's place in the document: keys and list indexes from the root.
FieldPath = tuple[str | int, ...]
#: Bounds on the parsed document: values (YAML aliases can multiply a small file) and nesting.
MAX_VALUES = 200_000
MAX_DEPTH = 64
#: libyaml's parser when PyYAML has it (about 10x faster; same nodes and marks).
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ClabError(TopologyError):
    """A Containerlab topology the importer cannot use; one line: ``FILE:LINE: FIELD: what is wrong;
    what to do``."""


def field_name(path: FieldPath) -> str:
    """``("topology", "nodes", "r1", "binds", 0)`` -> ``topology.nodes.r1.binds[0]``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(document)"


@dataclass
class Source:
    """A parsed topology file: its data and where each field is."""

    path: Path
    data: Any
    lines: dict[FieldPath, int] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        """The topology file's directory (Containerlab resolves relative paths against it)."""
        return self.path.resolve().parent

    def line(self, path: FieldPath) -> int:
        """Line of ``path``, or of its nearest ancestor that has one (1 for the document)."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return 1

    def error(self, path: FieldPath, message: str) -> ClabError:
        """A :class:`ClabError` for ``path``: ``FILE:LINE: FIELD: message``."""
        return ClabError(f"{self.path}:{self.line(path)}: {field_name(path)}: {message}")


def _walk(loader: Any, node: yaml.Node, path: FieldPath, lines: dict[FieldPath, int], src: Path) -> Any:
    if len(lines) > MAX_VALUES or len(path) > MAX_DEPTH:
        what = f"more than {MAX_VALUES} values (aliases expanded)" if len(lines) > MAX_VALUES else f"nested deeper than {MAX_DEPTH}"
        raise ClabError(f"{src}:{node.start_mark.line + 1}: {field_name(path)}: the document has {what}; simplify it")
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # merge keys (<<)
        out: dict[Any, Any] = {}
        for k_node, v_node in node.value:
            key = loader.construct_object(k_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise ClabError(f"{src}:{k_node.start_mark.line + 1}: {field_name(path)}: a key must be a plain value")
            key = str(key) if not isinstance(key, str) else key
            if key in out:
                raise ClabError(
                    f"{src}:{k_node.start_mark.line + 1}: {field_name((*path, key))}: given twice in one mapping "
                    f"(first at line {lines[(*path, key)]}); keep one"
                )
            lines[(*path, key)] = k_node.start_mark.line + 1
            out[key] = _walk(loader, v_node, (*path, key), lines, src)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            items.append(_walk(loader, item, (*path, i), lines, src))
        return items
    return loader.construct_object(node, deep=True)


def read(path: str | Path) -> Source:
    """Read and parse a topology file.

    Raises:
        ClabError: unreadable, too large, or malformed YAML (with the line).
    """
    p = Path(path)
    try:
        raw = read_regular_file(p)
    except OSError as e:
        raise ClabError(f"{p}: cannot read the topology file: {e.strerror}") from None
    except ValueError as e:
        raise ClabError(f"{p}: the topology file is {e}; give a .clab.yml file") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        raise ClabError(f"{p}: not UTF-8 text (byte {e.start})") from None
    loader = _Loader(text)
    lines: dict[FieldPath, int] = {}
    try:
        root = loader.get_single_node()
        data = None if root is None else _walk(loader, root, (), lines, p)
    except RecursionError:
        raise ClabError(f"{p}: the YAML is nested too deeply to read; simplify it") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{mark.line + 1}" if mark is not None else "1"
        raise ClabError(f"{p}:{where}: malformed YAML: {getattr(e, 'problem', None) or e}; fix the syntax there") from None
    finally:
        loader.dispose()
    return Source(path=p, data=data, lines=lines)
