"""The inventory A3-T works on: the scenario's records plus A3-T's own committed changes, and the
resources found on the devices.

Records. The deployed scenario (``<lab dir>/scenario.json``) is the baseline inventory; every
change set A3-T commits rewrites ``<lab dir>/a3t/state.json`` (the current service records,
version, the applied change sets) and writes ``<lab dir>/a3t/changes/<id>.json``. Both are read
from disk on every call, so another A3-T server process attached to the same lab (or a restarted
one) sees the same inventory. The state is tagged with the lab's baseline epoch
(:func:`substrate.scenario.deploy.baseline_epoch`): after a lab reset the devices are back at the
baseline, the epoch has changed, and the stale records are dropped.

Devices. Changes made at other levels (A0/A1 agents, a concurrent writer) are not in the records,
so before planning A3-T captures the kernel state of the routers and CE hosts
(:func:`substrate.devstate.capture`, no FRR, so a frozen control plane does not stall it) and
collects what is in use there (:func:`scan`): SID functions bound per node, routing-table ids,
prefixes per table, addresses and policy rules per port, firewall marks, floating addresses.
Allocation never picks a resource found there, and a request that collides with one is refused
with the device evidence.

Pure functions here (``scan``, ``circuits``, ``expected_state``) are unit-tested without a lab.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, TypeAdapter

from substrate import addressing as a
from substrate.devstate import DeviceState
from substrate.journal import write_durable
from substrate.scenario.generator import render_scenario, scenario_invariants
from substrate.scenario.layers.base import registry
from substrate.scenario.layers.l3vpn import Circuit, circuits, spare_circuits  # noqa: F401 - re-exported
from substrate.scenario.model import NodeConfig, Scenario

if TYPE_CHECKING:
    from substrate.lab import Lab

STATE_DIR = "a3t"
STATE_FILE = "state.json"
CHANGES_DIR = "changes"
STATE_SCHEMA_VERSION = 2


class AppliedChange(BaseModel):
    """A committed change set, for idempotency (same digest) and delete-after-delete."""

    change_id: str
    digest: str = Field(description="SHA-256 of the change set's canonical JSON.")
    version: int = Field(description="Inventory version the change set produced.")
    deleted: list[str] = Field(default_factory=list, description="Instance ids it deleted.")


class A3State(BaseModel):
    """``<lab dir>/a3t/state.json``: the service records after A3-T's committed change sets."""

    schema_version: int = STATE_SCHEMA_VERSION
    epoch: str = Field(description="Baseline epoch of the lab these records belong to.")
    version: int = Field(default=0, description="Committed change sets since the baseline.")
    next_change: int = Field(default=1, description="Number of the next change id (c<N>).")
    records: dict[str, Any] | None = Field(default=None, description="Scenario field -> its records (every service "
                                           "class's records and derived fields), as JSON; None before the first change set.")
    applied: list[AppliedChange] = Field(default_factory=list)

    def deleted_by(self, instance_id: str) -> str | None:
        """The change that deleted ``instance_id`` last, if any."""
        for ch in reversed(self.applied):
            if instance_id in ch.deleted:
                return ch.change_id
        return None


@functools.cache
def _adapter(fld: str) -> TypeAdapter[Any]:
    return TypeAdapter(Scenario.model_fields[fld].annotation)


def record_fields(sc: Scenario) -> tuple[str, ...]:
    """The Scenario fields A3-T keeps: the ``records`` and ``derived`` fields of every service
    class the scenario has."""
    return tuple(f for c in registry() if c.name in sc.layers for f in (*c.records, *c.derived))


class Records:
    """Reading and writing A3-T's records in a lab directory (see module docstring)."""

    def __init__(self, lab: Lab):
        self.lab = lab
        self.dir = lab.dir / STATE_DIR
        self._base: tuple[tuple[int, int], Scenario] | None = None

    # -- reading ---------------------------------------------------------------------------------

    def base_scenario(self) -> Scenario:
        """The deployed scenario (cached while its file is unchanged: it is written once, at deploy).

        Raises:
            SubstrateError: the lab was not deployed from a scenario.
        """
        from substrate.scenario.deploy import SCENARIO_FILE, load_scenario

        path = self.lab.dir / SCENARIO_FILE
        try:
            st = path.stat()
            key = (st.st_mtime_ns, st.st_size)
        except OSError:
            key = (0, 0)
        if self._base is None or self._base[0] != key:
            self._base = (key, load_scenario(self.lab))
        return self._base[1]

    def epoch(self) -> str:
        from substrate.scenario.deploy import baseline_epoch

        return baseline_epoch(self.lab)

    def state(self) -> A3State:
        """The current state (a fresh one when there is none or it belongs to an earlier epoch)."""
        epoch = self.epoch()
        path = self.dir / STATE_FILE
        try:
            st = A3State.model_validate_json(path.read_text())
        except (OSError, ValueError):
            return A3State(epoch=epoch)
        return st if st.epoch == epoch else A3State(epoch=epoch)

    def inventory(self, state: A3State | None = None) -> tuple[Scenario, A3State]:
        """The current inventory (scenario records + committed changes), rendered, with its invariants."""
        st = state or self.state()
        base = self.base_scenario()
        sc = base.model_copy(deep=True)
        update = {f: v for f, v in (st.records or {}).items() if f in record_fields(base)}
        if update:
            sc = sc.model_copy(update={f: _adapter(f).validate_python(v) for f, v in update.items()})
            sc.node_config = render_scenario(sc)
            sc.invariants = scenario_invariants(sc)
        return sc, st

    def change(self, change_id: str) -> dict[str, Any] | None:
        """A stored change record (JSON), or None."""
        if not re.fullmatch(r"c\d{1,9}", change_id):
            return None
        path = self.dir / CHANGES_DIR / f"{change_id}.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if data.get("epoch") == self.epoch() else None

    def change_ids(self) -> list[str]:
        epoch = self.epoch()
        out = []
        for p in sorted((self.dir / CHANGES_DIR).glob("c*.json"), key=lambda p: int(p.stem[1:]) if p.stem[1:].isdigit() else 0):
            with contextlib.suppress(OSError, ValueError):
                if json.loads(p.read_text()).get("epoch") == epoch:
                    out.append(p.stem)
        return out

    # -- writing (under the transaction lock) ------------------------------------------------------

    @contextlib.contextmanager
    def transaction_lock(self, holder: str, timeout_s: float) -> Iterator[None]:
        """Serialize A3-T transactions on this lab across processes (flock, bounded wait).

        Raises:
            ConfigLockHeld: another change set held it for ``timeout_s`` (names its holder).
        """
        from substrate.locks import config_lock

        self.dir.mkdir(parents=True, exist_ok=True)
        with config_lock(self.dir, ["a3t-transaction"], holder=holder, timeout_s=timeout_s):
            yield

    def drop_stale(self) -> None:
        """Remove records of an earlier baseline epoch (call under the transaction lock)."""
        epoch = self.epoch()
        path = self.dir / STATE_FILE
        try:
            old = json.loads(path.read_text()).get("epoch")
        except (OSError, ValueError):
            old = None
        if old is not None and old != epoch:
            path.unlink(missing_ok=True)
            shutil.rmtree(self.dir / CHANGES_DIR, ignore_errors=True)

    def _write(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_durable(path, text)

    def next_change_id(self, state: A3State) -> str:
        """Reserve the next change id (persists the counter)."""
        cid = f"c{state.next_change}"
        state.next_change += 1
        self._write(self.dir / STATE_FILE, state.model_dump_json())
        return cid

    def commit(self, state: A3State, sc: Scenario, applied: AppliedChange) -> None:
        """Persist the new records (atomically) after a successful change set."""
        state.records = sc.model_dump(mode="json", include=set(record_fields(sc)))
        state.version = applied.version
        state.applied.append(applied)
        self._write(self.dir / STATE_FILE, state.model_dump_json())

    def save_change(self, change_id: str, record: dict[str, Any]) -> None:
        self._write(self.dir / CHANGES_DIR / f"{change_id}.json", json.dumps({**record, "epoch": self.epoch()}))

    def latest_change(self) -> str | None:
        """The id of the most recent change record of this epoch, if any."""
        ids = self.change_ids()
        return ids[-1] if ids else None


# -- resources found on devices ----------------------------------------------------------------------


@dataclass
class Found:
    """Resources in use in the devices' kernel state (see :func:`scan`)."""

    functions: dict[str, set[int]] = field(default_factory=dict)
    tables: set[int] = field(default_factory=set)
    table_prefixes: dict[int, dict[str, set[str]]] = field(default_factory=dict)
    port_addrs: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    port_rules: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    marks: set[int] = field(default_factory=set)
    floating: set[str] = field(default_factory=set)

    def minus(self, other: Found) -> Found:
        """What is found here and not in ``other`` (e.g. devices minus what the records explain)."""
        return Found(
            functions={n: fs - other.functions.get(n, set()) for n, fs in self.functions.items() if fs - other.functions.get(n, set())},
            tables=self.tables - other.tables,
            table_prefixes={t: {p: ns for p, ns in ps.items() if p not in other.table_prefixes.get(t, {})}
                            for t, ps in self.table_prefixes.items()
                            if any(p not in other.table_prefixes.get(t, {}) for p in ps)},
            port_addrs={k: v - other.port_addrs.get(k, set()) for k, v in self.port_addrs.items() if v - other.port_addrs.get(k, set())},
            port_rules={k: v - other.port_rules.get(k, set()) for k, v in self.port_rules.items() if v - other.port_rules.get(k, set())},
            marks=self.marks - other.marks,
            floating=self.floating - other.floating,
        )  # fmt: skip


_SKIP_PORTS = frozenset({"lo", "sr0"})
_DEFAULTS = frozenset({"::/0", "0.0.0.0/0", "default"})


def _route_dst(route: str) -> str:
    words = route.split()
    if words and words[0] in ("unreachable", "blackhole", "prohibit", "throw", "local", "broadcast", "multicast", "anycast"):
        words = words[1:]
    return words[0] if words else ""


def _route_table(route: str) -> int | None:
    """The route's own table (``DST table N ...`` before any encap keyword), if numeric."""
    words = route.split()
    for i, w in enumerate(words):
        if w in ("encap", "via", "dev", "nexthop"):
            return None
        if w == "table" and i + 1 < len(words) and words[i + 1].isdigit():
            return int(words[i + 1])
    return None


def _function_of(sc_node_id: int | None, dst: str) -> int | None:
    """Local SID function of ``dst`` when it is a /64 function SID inside the node's locator."""
    if sc_node_id is None or "/" not in dst:
        return None
    try:
        net = ipaddress.IPv6Network(dst)
    except ValueError:
        return None
    if net.prefixlen != a.BLOCK_LEN + 2 * a.CSID_LEN or not net.subnet_of(a.locator(sc_node_id)):
        return None
    return (int(net.network_address) >> (128 - a.BLOCK_LEN - 2 * a.CSID_LEN)) & 0xFFFF


def scan(sc: Scenario, states: dict[str, DeviceState]) -> Found:
    """Collect the resources in use in ``states`` (kernel state of some nodes of ``sc``'s topology)."""
    f = Found()
    for node, st in states.items():
        try:
            nid = sc.topology.node(node).node_id
        except KeyError:
            nid = None
        for fam in (6, 4):
            for r in getattr(st, f"routes{fam}"):
                dst = _route_dst(r)
                if fam == 6 and "seg6local" in r:
                    fn = _function_of(nid, dst)
                    if fn is not None:
                        f.functions.setdefault(node, set()).add(fn)
                    m = re.search(r"action End\.DT\d+ (?:vrf)?table (\d+)", r)
                    if m:
                        f.tables.add(int(m.group(1)))
                t = _route_table(r)
                if t is not None:
                    f.tables.add(t)
                    if dst and dst not in _DEFAULTS:
                        f.table_prefixes.setdefault(t, {}).setdefault(dst, set()).add(node)
            for rule in getattr(st, f"rules{fam}"):
                m = re.search(r"lookup (\d+)", rule)
                if m:
                    f.tables.add(int(m.group(1)))
                m = re.search(r"fwmark (0x[0-9a-f]+|\d+)", rule)
                if m:
                    f.marks.add(int(m.group(1), 0))
                m = re.search(r"iif (\S+)", rule)
                if m:
                    f.port_rules.setdefault((node, m.group(1)), set()).add(f"-{fam} {rule}")
        for addr in st.addresses:
            ip, _, dev = addr.partition(" dev ")
            dev = dev.strip()
            if dev and dev not in _SKIP_PORTS:
                f.port_addrs.setdefault((node, dev), set()).add(ip.strip())
        for c in registry():
            c.found_in(node, st, f)
    return f


def _frr_addresses(blocks: list[str]) -> list[str]:
    """``ADDR/LEN dev IF`` for ``ipv6 address``/``ip address`` lines of FRR interface stanzas."""
    out = []
    for block in blocks:
        lines = block.splitlines()
        if not lines or not lines[0].startswith("interface "):
            continue
        ifname = lines[0].split()[1]
        for ln in lines[1:]:
            w = ln.split()
            if len(w) == 3 and w[0] in ("ip", "ipv6") and w[1] == "address":
                out.append(f"{w[2]} dev {ifname}")
    return out


def expected_state(node: str, cfg: NodeConfig) -> DeviceState:
    """The kernel state a rendering implies, as a DeviceState to :func:`scan` (routes, rules,
    addresses -- including the interface addresses given in FRR stanzas --, nftables text)."""
    return DeviceState(
        node=node, routes4=list(cfg.routes4), routes6=list(cfg.routes6), rules4=list(cfg.rules4), rules6=list(cfg.rules6),
        addresses=[*cfg.addresses, *_frr_addresses(cfg.frr)], nft="\n".join(cfg.nft.values()),
    )  # fmt: skip


def expected_found(sc: Scenario) -> Found:
    """What the records' rendering puts on the devices, in :class:`Found` form."""
    return scan(sc, {n: expected_state(n, cfg) for n, cfg in sc.node_config.items()})


def scanned_nodes(sc: Scenario) -> list[str]:
    """Nodes whose state the device scan reads: every router and every circuit's CE host."""
    return [n.name for n in sc.topology.routers] + sorted({c.ce for c in circuits(sc).values()})
