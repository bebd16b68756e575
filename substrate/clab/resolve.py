"""Containerlab's inheritance of node settings from ``defaults``, ``kinds`` and ``groups``, as its
``types/topology.go`` resolves them (srl-labs/containerlab, read at commit 39ff2b7):

- kind: the node's ``kind``, else its group's, else the kind of the group named by
  ``defaults.group``, else ``defaults.kind`` (``GetNodeKind``);
- group: the node's ``group``, else its kind's (``kinds.<kind>.group``), else ``defaults.group``
  (``GetNodeGroup``);
- one-value fields (``image``, ``startup-config``, ``extras``, ...): the first level that sets
  it, in the order node, group, kind, defaults (``getField``);
- lists (``exec``, ``binds``, ...): defaults, then kind, then group, then node, concatenated and
  de-duplicated keeping the first occurrence (``mergeStringSliceFields``); binds are then keyed
  by destination, the most specific level winning (``GetNodeBinds``);
- maps (``labels``, ``sysctls``, ``env``): merged in the same order, later levels overriding
  (``mergeStringMapFields``);
- ``mgmt-ipv4``/``mgmt-ipv6``: the node's own only (``NewNodeConfig``).

Every value comes back with the field path it was taken from, so errors name the line that set it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from substrate.clab.source import FieldPath


@dataclass(frozen=True)
class Level:
    """One level of a node's settings: its path in the document and its mapping."""

    path: FieldPath
    data: dict[str, Any]


def _mapping(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


class Resolver:
    """Resolves the settings of the nodes of one ``topology`` mapping."""

    def __init__(self, topology: dict[str, Any]):
        self.nodes = _mapping(topology.get("nodes"))
        self.kinds = _mapping(topology.get("kinds"))
        self.groups = _mapping(topology.get("groups"))
        self.defaults = _mapping(topology.get("defaults"))
        self._levels: dict[str, list[Level]] = {}

    def _node(self, name: str) -> dict[str, Any]:
        return _mapping(self.nodes.get(name))

    def kind(self, name: str) -> tuple[str, FieldPath] | None:
        """The node's kind and where it was set (None when no level sets one)."""
        node = self._node(name)
        if node.get("kind"):
            return str(node["kind"]), ("topology", "nodes", name, "kind")
        g = node.get("group")
        if g and _mapping(self.groups.get(g)).get("kind"):
            return str(self.groups[g]["kind"]), ("topology", "groups", g, "kind")
        dg = self.defaults.get("group")
        if dg and _mapping(self.groups.get(dg)).get("kind"):
            return str(self.groups[dg]["kind"]), ("topology", "groups", dg, "kind")
        if self.defaults.get("kind"):
            return str(self.defaults["kind"]), ("topology", "defaults", "kind")
        return None

    def group(self, name: str) -> str:
        """The node's group ('' when none)."""
        node = self._node(name)
        if node.get("group"):
            return str(node["group"])
        k = self.kind(name)
        if k and _mapping(self.kinds.get(k[0])).get("group"):
            return str(self.kinds[k[0]]["group"])
        return str(self.defaults.get("group") or "")

    def levels(self, name: str) -> list[Level]:
        """The node's levels, most specific first: node, group, kind, defaults (those that exist)."""
        if name in self._levels:
            return self._levels[name]
        out = [Level(("topology", "nodes", name), self._node(name))]
        g = self.group(name)
        if g and isinstance(self.groups.get(g), dict):
            out.append(Level(("topology", "groups", g), self.groups[g]))
        k = self.kind(name)
        if k and isinstance(self.kinds.get(k[0]), dict):
            out.append(Level(("topology", "kinds", k[0]), self.kinds[k[0]]))
        out.append(Level(("topology", "defaults"), self.defaults))
        self._levels[name] = out
        return out

    def value(self, name: str, key: str) -> tuple[Any, FieldPath] | None:
        """A one-value field: the most specific level that sets it (non-empty), with its path."""
        for lv in self.levels(name):
            v = lv.data.get(key)
            if v is not None and v != "" and v != [] and v != {}:
                return v, (*lv.path, key)
        return None

    def merged_list(self, name: str, key: str) -> list[tuple[Any, FieldPath]]:
        """A list field merged from defaults to node, de-duplicated (first occurrence kept)."""
        out: list[tuple[Any, FieldPath]] = []
        seen: set[str] = set()
        for lv in reversed(self.levels(name)):
            items = lv.data.get(key)
            if not isinstance(items, list):
                continue
            for i, item in enumerate(items):
                k = repr(item)
                if k not in seen:
                    seen.add(k)
                    out.append((item, (*lv.path, key, i)))
        return out

    def merged_map(self, name: str, key: str) -> dict[str, tuple[Any, FieldPath]]:
        """A map field merged from defaults to node, later levels overriding."""
        out: dict[str, tuple[Any, FieldPath]] = {}
        for lv in reversed(self.levels(name)):
            m = lv.data.get(key)
            if isinstance(m, dict):
                for k, v in m.items():
                    out[str(k)] = (v, (*lv.path, key, str(k)))
        return out
