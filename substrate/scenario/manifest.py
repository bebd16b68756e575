"""Scenario manifests: a topology base, ordered service-class layers with parameters, a state
density and a seed (draft section 6). YAML on disk, validated by pydantic; every error names the
field and the line.

Example::

    name: srv6-brownfield
    topology: grid:5x5:nohosts
    seed: 7
    density: 2
    layers:
      - underlay
      - addressing
      - l3vpn: {tenants_per_density: 3, sites: [2, 7], overlap_rate: 0.25}
      - steering
      - firewall
      - floating_ip: {border_pe: r5}
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from substrate.errors import SubstrateError


class ManifestError(SubstrateError):
    """A manifest is malformed or inconsistent. ``field`` and ``line`` say where."""

    def __init__(self, message: str, *, field: str = "", line: int | None = None, source: str = "manifest"):
        self.field, self.line = field, line
        where = source + (f" line {line}" if line else "") + (f", {field}" if field else "")
        super().__init__(f"{where}: {message}")


class LayerSpec(BaseModel):
    """One layer of a manifest: its registered name and parameters."""

    model_config = ConfigDict(extra="forbid")
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class Manifest(BaseModel):
    """A scenario manifest (see module docstring)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    description: str = ""
    topology: str = Field(description="Topology base: line:N, ring:N, grid:RxC[:nohosts] or a YAML file.")
    seed: int = Field(default=0, ge=0, description="Default seed (harness scenario build --seed overrides).")
    density: int = Field(default=1, ge=1, le=20, description="State density: instances per class scale with it.")
    layers: list[LayerSpec] = Field(min_length=1)

    _lines: dict[tuple[Any, ...], int] = PrivateAttr(default_factory=dict)
    _source: str = PrivateAttr(default="manifest")

    def line_of(self, field: str) -> int | None:
        """The line of a field named like a generation error names it: ``layers.<layer>.<param>``,
        a field a class reports errors under (``ServiceClass.error_fields``: ``pools.<pool>``, the
        addressing class's parameter), ``density``, ``topology``."""
        parts = field.split(".")
        names = [spec.name for spec in self.layers]
        path: tuple[Any, ...] = tuple(parts)
        from substrate.scenario.layers import registry

        owner = next((c.name for c in registry() if parts[0] in c.error_fields and c.name in names), None)
        if owner is not None:  # a field a class reports errors under, e.g. pools.<pool> (addressing)
            parts = ["layers", owner, *parts[1:]]
        if parts[0] == "layers" and len(parts) > 1 and parts[1] in names:
            i = names.index(parts[1])
            path = ("layers", i, parts[1], *parts[2:])
            if path[:2] + path[3:] in self._lines:  # a layer written as a bare name
                path = path[:2] + path[3:]
        return _closest_line(self._lines, path) if self._lines else None

    def error(self, message: str, field: str) -> ManifestError:
        """A ManifestError for ``field``, with its line when the manifest came from text."""
        return ManifestError(message, field=field, line=self.line_of(field), source=self._source)

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of the manifest (seed and density excluded)."""
        data = self.model_dump(mode="json", exclude={"seed", "density"})
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _line_map(node: yaml.Node, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], int]:
    """Map every path in a composed YAML document to its 1-based line."""
    out = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value
            out[(*path, key)] = k.start_mark.line + 1
            out.update(_line_map(v, (*path, key)))
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out.update(_line_map(v, (*path, i)))
    return out


def _closest_line(lines: dict[tuple[Any, ...], int], path: tuple[Any, ...]) -> int | None:
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return lines.get(())


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate a manifest file, layers and their parameters included.

    Raises:
        ManifestError: unreadable file, malformed YAML, unknown field or layer, bad parameter,
            missing prerequisite or duplicated layer -- naming the field and the line.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ManifestError(f"cannot read: {e.strerror}", source=str(p)) from None
    return parse_manifest(text, source=str(p))


def parse_manifest(text: str, source: str = "manifest") -> Manifest:
    """Validate manifest text (see :func:`load_manifest`)."""
    from substrate.scenario.layers import get_layer

    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ManifestError(f"malformed YAML: {getattr(e, 'problem', e)}",
                            line=mark.line + 1 if mark else None, source=source) from None
    if not isinstance(data, dict) or node is None:
        raise ManifestError("expected a mapping with name, topology and layers", line=1, source=source)
    lines = _line_map(node)
    raw_layers = data.get("layers")
    specs: list[dict[str, Any]] = []
    yaml_paths: list[tuple[Any, ...]] = []
    if isinstance(raw_layers, list):
        for i, item in enumerate(raw_layers):
            if isinstance(item, str):
                specs.append({"name": item, "params": {}})
                yaml_paths.append(("layers", i))
            elif isinstance(item, dict) and len(item) == 1:
                (name, params), = item.items()
                specs.append({"name": name, "params": params or {}})
                yaml_paths.append(("layers", i, name))
            else:
                raise ManifestError("each layer is a name or a one-key mapping {name: {params}}",
                                    field=f"layers[{i}]", line=_closest_line(lines, ("layers", i)), source=source)
        data = {**data, "layers": specs}
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as e:
        # unknown keys first: a misspelt field also shows up as a missing one, and the
        # misspelling is what the author must see
        errs = sorted(e.errors(), key=lambda x: x["type"] != "extra_forbidden")
        where = []
        for err in errs:
            loc = tuple(err["loc"])
            ypath = loc
            if loc and loc[0] == "layers" and len(loc) > 1 and isinstance(loc[1], int) and loc[1] < len(yaml_paths):
                ypath = yaml_paths[loc[1]] + tuple(x for x in loc[2:] if x != "params")
            where.append((".".join(str(x) for x in loc), _closest_line(lines, ypath), err["msg"]))
        field, line, msg = where[0]
        if len(where) > 1:
            msg += "; also " + "; ".join(f"line {ln}, {f}: {m}" for f, ln, m in where[1:3])
        raise ManifestError(msg, field=field, line=line, source=source) from None
    seen: list[str] = []
    for i, spec in enumerate(manifest.layers):
        where = {"field": f"layers[{i}]", "line": _closest_line(lines, yaml_paths[i]), "source": source}
        try:
            layer = get_layer(spec.name)
        except KeyError as e:
            raise ManifestError(str(e.args[0]), **where) from None
        if spec.name in seen:
            raise ManifestError(f"layer {spec.name!r} appears twice", **where)
        missing = [r for r in layer.requires if r not in seen]
        if missing:
            raise ManifestError(f"layer {spec.name!r} needs {', '.join(repr(m) for m in missing)} before it", **where)
        try:
            layer.Params.model_validate(spec.params)
        except ValidationError as e:
            err = e.errors()[0]
            sub = tuple(err["loc"])
            raise ManifestError(
                err["msg"], field=f"layers[{i}].{spec.name}." + ".".join(str(x) for x in sub),
                line=_closest_line(lines, yaml_paths[i] + sub), source=source,
            ) from None
        seen.append(spec.name)
    manifest._lines = lines
    manifest._source = source
    return manifest


def manifest_json_schema() -> dict[str, Any]:
    """JSON Schema of manifests, with every registered layer's parameters."""
    from substrate.scenario.layers import LAYERS

    schema = Manifest.model_json_schema()
    variants: list[dict[str, Any]] = [{"type": "string", "enum": sorted(LAYERS)}]
    for name in sorted(LAYERS):
        variants.append({
            "type": "object",
            "properties": {name: LAYERS[name].Params.model_json_schema()},
            "required": [name],
            "additionalProperties": False,
        })
    schema["properties"]["layers"] = {"type": "array", "minItems": 1, "items": {"anyOf": variants},
                                      "description": "Ordered service-class layers: a name, or {name: {params}}."}
    schema.pop("$defs", None)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "anibench scenario manifest"
    return schema
