"""What is persisted about a deployed lab (``lab.json``) and the process checks it relies on.

Below both :mod:`substrate.lab` (the handle) and the backends (which fill the record in), so that
no backend imports the lab module back (DESIGN.md: backends stay behind the ``Backend`` protocol).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from substrate.topology import SETUP_FIELDS, Role, Topology

RECORD_SCHEMA_VERSION = 1


class NodeState(BaseModel):
    """Runtime state of one deployed node."""

    name: str
    role: Role
    netns: str = Field(description="Name of the node's network namespace (ip netns).")
    init_pid: int = Field(default=0, description="Host PID of the node's init (PID 1 inside the node).")
    init_start: int = Field(default=0, description="Start time of init (clock ticks since boot), guards against PID reuse.")
    daemons: list[str] = Field(default_factory=list, description="FRR daemons the node runs.")
    cgroups: list[str] = Field(
        default_factory=list, description="The cgroups the node's processes join (confine.create_lab_cgroups); the first tracks membership.")


class LabRecord(BaseModel):
    """What is persisted about a lab (``lab.json``); versioned."""

    schema_version: int = RECORD_SCHEMA_VERSION
    name: str
    backend: str = "netns"
    status: Literal["creating", "up"] = "creating"
    detached: bool = Field(
        default=False, description="Outlives its creator (harness lab up); set only once the bring-up is complete.")
    owner_pid: int = Field(description="PID of the process that created the lab.")
    owner_start: int = Field(
        default=0, description="Start time of the owner (clock ticks since boot; 0: unknown), guards against PID reuse.")
    created_at: float
    topology: Topology
    nodes: dict[str, NodeState] = Field(default_factory=dict)
    features: str = ""
    dataplane: str = Field(default="kernel", description="The SRv6 data plane the lab runs on: kernel (seg6) or ebpf (substrate.dataplane).")
    node_limits: dict[str, int] = Field(default_factory=dict, description="Resource limits of each node (confine.NodeLimits).")
    meta: dict[str, Any] = Field(default_factory=dict, description="Free-form data of upper layers (e.g. scenario).")

    @model_serializer(mode="wrap")
    def _split_setup(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Imported nodes' own set-up (FRR files, daemons, exec, ...) is written beside the
        topology (``node_setup``), not in it: a reader of the model before that set-up existed
        (another checkout's ``harness lab cleanup``) still reads the record, sees a live lab and
        leaves it alone; it ignores the extra key."""
        out = handler(self)
        setup = {}
        for n in out["topology"]["nodes"]:
            own = {k: n.pop(k) for k in SETUP_FIELDS if k in n}
            if own:
                setup[n["name"]] = own
        if setup:
            out["node_setup"] = setup
        return out

    @model_validator(mode="before")
    @classmethod
    def _merge_setup(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("node_setup"):
            data = dict(data)
            setup = data.pop("node_setup")
            topo = dict(data["topology"])
            topo["nodes"] = [{**n, **setup.get(n.get("name"), {})} for n in topo["nodes"]]
            data["topology"] = topo
        return data


def pid_start(pid: int) -> int:
    """Start time of a process (field 22 of /proc/PID/stat), 0 if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[19])


def pid_alive(pid: int, start: int | None = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, if ``start`` is given, is the same process as
    when recorded (PIDs are reused)."""
    if pid <= 0:
        return False
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and (not start or int(fields[19]) == start)
