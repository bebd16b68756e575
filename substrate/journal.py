"""Device transactions that survive the death of the process running them: a durable journal,
the before-state of exactly what a change sets, undo, and recovery.

Generic machinery for any level that changes several devices as one transaction (A3-T's change
sets; A3-R's reconciler and A4 reuse it): nothing here knows service classes, MCP or agents.

**Items.** A device change (a :class:`~substrate.scenario.apply.ConfigDelta`) is described by the
items it sets (:class:`Item`): a route (identified by its key: type, destination, table, metric),
a policy rule, an interface address, an interface's admin state, an nftables table, a sysctl, an
FRR configuration line (stanza head + line). For each, the journal keeps the value the device had
before the change (read from a capture taken under the device's configuration lock) and the
value the change gives it. Undoing a change puts back only the items that still hold the
change's value: whatever else happened on the device meanwhile (a fault, another operator) is
left alone, and an item someone else changed after us is reported, not overwritten
(:func:`undo`). Values are compared in normalized form (:func:`same_value`).

**Journal.** One JSON file per transaction under ``<lab dir>/journal/`` (host side), written
before any device is touched and rewritten (write, fsync, rename, fsync of the directory) at
each phase:

- ``applying``: the devices, their items with before- and after-values, and the caller's payload
  (intent, what to report) -- written before the first device command;
- ``validating``: every device accepted its change;
- ``rolling_back``: the change is being undone (validation failed, a device refused it, the
  caller cancelled, or recovery found the transaction unfinished);
- ``rolled_back`` / ``committed``: finished. ``abandoned``: closed by a lab reset (every device
  was put back to the baseline).

The commit point is the caller's (A3-T: its records written with the change in them); a
transaction found unfinished is completed if the caller says it was committed, else undone
(:func:`recover`).

**Device scripts** run as ``bash -c SCRIPT TAG`` with the transaction's tag as ``$0``: a process
that dies leaves its scripts running in the nodes (they are not its children there), so recovery
first kills every process carrying the tag, and their descendants (:func:`kill_scripts`), then
undoes. An interrupted script leaves each item at its before- or after-value (every command is
atomic per item), which undo handles alike.

**Startup configuration.** A committed change's FRR lines are written into the node's
``frr.conf`` (:func:`persist_frr`), as an operator saves the configuration, so that they survive
a daemon restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from substrate.devstate import (
    LINK_ATTRS,
    DeviceState,
    canonical_frr,
    capture,
    daemon_config_lines,
    frr_daemon_delta,
    frr_nested,
    frr_subtree,
    link_attrs,
    neigh_key,
)
from substrate.errors import SubstrateError
from substrate.routes import route_key
from substrate.scenario.apply import INGRESS_KINDS, ConfigDelta, frr_lines, nft_delete, nft_replace, qdisc_value
from substrate.topology import Role

if TYPE_CHECKING:
    from substrate.lab import Lab

JOURNAL_DIR = "journal"
SCHEMA_VERSION = 1

ItemKind = Literal["route4", "route6", "rule4", "rule6", "address", "link", "mtu", "nft", "sysctl", "frr", "qdisc", "tunsrc",
                   "neigh4", "neigh6", "nexthop", "ingress", "linkattr"]
Phase = Literal["applying", "validating", "rolling_back", "rolled_back", "committed", "abandoned"]
FINISHED: frozenset[str] = frozenset({"rolled_back", "committed", "abandoned"})
#: Value of a present rule, address or FRR line (absent: None).
PRESENT = "present"
#: Separator of an FRR item's key: ``<stanza head>\t<line>`` (FRR lines hold no tab).
_FRR_SEP = "\t"


class JournalError(SubstrateError):
    """The journal could not be written (nothing was changed on the devices) or read."""


# -- items -------------------------------------------------------------------------------------------


class Item(BaseModel):
    """One piece of device state a change sets, with its value before and after (None: absent).

    Keys and values per kind: ``route4|route6``: the route key (:func:`substrate.routes.route_key`)
    -> the canonical route (``route add`` arguments); ``rule4|rule6``: the rule (``rule add``
    arguments) -> ``present``; ``address``: ``ADDR/LEN dev IF`` -> ``present``; ``link``: the
    interface -> ``up|down``; ``mtu``: the interface -> its MTU (decimal); ``nft``: the table (``inet tenant_fw``) -> its ``nft list`` text;
    ``sysctl``: the path under /proc/sys -> the value; ``frr``: ``<stanza head>\\t<line>`` ->
    ``present``; ``qdisc``: the interface -> its root qdisc
    (:func:`substrate.scenario.apply.qdisc_value`; absent: the device's default); ``ingress``: the
    interface -> its ingress-side qdisc (``clsact`` or ``ingress``); ``neigh4|neigh6``: a static
    neighbour entry's key (``ADDR dev IF``, ``proxy ADDR dev IF``) -> its ``neigh replace``
    arguments; ``nexthop``: ``id N`` -> the nexthop object's ``nexthop add`` arguments;
    ``linkattr``: ``IF ATTR`` (:data:`substrate.devstate.LINK_ATTRS`) -> its ``ip link set`` value
    (:func:`substrate.devstate.link_attrs`; ``master`` ``""`` for none). The last four are no service's: a reconciler's repair of what was added below it sets them (issue 35).

    An FRR line the change removes that has lines nested under it (a stanza head: ``route-map X
    permit 10`` with its ``match`` and ``set`` lines, ``router isis X``; ``address-family`` under
    ``router bgp``) goes with all of them (FRR's ``no HEAD``): its ``frr_daemons`` keeps each
    daemon's copy of the whole subtree (:func:`substrate.devstate.frr_subtree`), which undo puts
    back to exactly those daemons (:func:`undo_device`), every nested line included.
    """

    kind: ItemKind
    key: str
    before: str | None
    after: str | None
    frr_daemons: dict[str, str] | None = Field(
        default=None, description="FRR item removed with nested lines: daemon -> its copy of the line and everything nested "
        "under it, with the lines it is nested in (frr_subtree), as before the change; None otherwise.")

    def label(self) -> str:
        """Human-readable name of the item (for reports)."""
        if self.kind == "frr":
            head, _, line = self.key.partition(_FRR_SEP)
            return f"FRR '{head} / {line}'" if head else f"FRR '{line}'"
        names = {"route4": "ip -4 route", "route6": "ip -6 route", "rule4": "ip -4 rule", "rule6": "ip -6 rule",
                 "address": "address", "link": "link", "mtu": "MTU of", "nft": "nft table", "sysctl": "sysctl", "qdisc": "root qdisc of",
                 "tunsrc": "SRv6 encapsulation source"}  # fmt: skip
        return f"{names[self.kind]} {self.key}".rstrip()


def _frr_key(head: str, line: str) -> str:
    return f"{head}{_FRR_SEP}{line}"


def nft_tables(text: str) -> dict[str, str]:
    """``nft list ruleset`` text split into tables: ``"FAMILY NAME" -> "table FAMILY NAME { ... }"``."""
    out: dict[str, str] = {}
    cur: list[str] | None = None
    name = ""
    for line in text.splitlines():
        m = re.match(r"table (\S+) (\S+) \{$", line)
        if m and cur is None:
            name, cur = f"{m.group(1)} {m.group(2)}", [line]
        elif cur is not None:
            cur.append(line)
            if line == "}":
                out[name] = "\n".join(cur) + "\n"
                cur = None
    return out


def normalize_nft_table(text: str) -> str:
    """An nftables table in comparable form: counter values and blank lines dropped, whitespace
    collapsed, hexadecimal numbers canonical (``nft`` prints ``meta mark set 0x00000100`` for a
    rule written ``0x100``)."""
    text = re.sub(r"counter packets \d+ bytes \d+", "counter", text)
    text = re.sub(r"0x([0-9a-fA-F]+)", lambda m: hex(int(m.group(1), 16)), text)
    return "\n".join(" ".join(ln.split()) for ln in text.splitlines() if ln.strip())


def nft_blocks(text: str) -> dict[str, list[str]]:
    """A normalized nftables table (:func:`normalize_nft_table`) as ``{block head: [lines]}``: each
    chain, set, map or flowtable of the table (``chain forward {``) with its body lines in order
    (rules in evaluation order; a nested block's lines stay in its parent's body); the table's own
    lines outside any block under ``""``."""
    out: dict[str, list[str]] = {"": []}
    head, depth = "", 0
    for ln in normalize_nft_table(text).splitlines():
        if depth == 0:  # the table line
            depth += ln.endswith("{")
            continue
        if depth == 1 and ln.endswith("{"):
            head, depth = ln[:-1].strip(), 2
            out.setdefault(head, [])
            continue
        if ln == "}" or ln.startswith("}"):
            depth -= 1
            if depth == 1:
                head = ""
                continue
            if depth == 0:
                continue
        elif ln.endswith("{"):
            depth += 1
        out.setdefault(head, []).append(ln)
    return out


def normalize_route(route: str) -> str:
    """A canonical route string in comparable form (``ip`` shows an IPv6 ``unreachable`` route
    with ``dev lo``, which is not part of what was written)."""
    w = route.split()
    if w and w[0] in ("unreachable", "blackhole", "prohibit") and w[-2:] == ["dev", "lo"]:
        w = w[:-2]
    return " ".join(w)


def same_value(kind: str, a: str | None, b: str | None) -> bool:
    """Whether two values of an item of ``kind`` are the same state (normalized)."""
    if a is None or b is None:
        return a is b
    if kind in ("route4", "route6"):
        return normalize_route(a) == normalize_route(b)
    if kind == "nft":
        return normalize_nft_table(a) == normalize_nft_table(b)
    return a == b


class FrrView:
    """The FRR configuration lines of a node, as ``{stanza head: {lines}}`` (top-level lines are
    heads with no lines), merged over the daemons that answered."""

    def __init__(self, daemons: dict[str, str]):
        #: daemon -> its own ``show running-config`` (what the view was made from)
        self.daemons = dict(daemons)
        self.stanzas = {h: set(body) for h, body in canonical_frr(daemons)}

    def has(self, head: str, line: str) -> bool:
        return line in self.stanzas if not head else line in self.stanzas.get(head, set())


def read_frr(lab: Lab, node: str, timeout_s: float = 2.0) -> FrrView:
    """The FRR configuration of ``node`` read from each running daemon's vty socket. A daemon that
    is not running is left out (its lines are absent, as vtysh shows them).

    Raises:
        SubstrateError: a daemon runs but does not answer (frozen): FRR cannot be read now.
    """
    from substrate.vty import VtyError, VtyUnreachable

    out: dict[str, str] = {}
    for d in lab.state(node).daemons:
        try:
            text, status = lab.vty(node, d, "show running-config", timeout_s=timeout_s)[0]
        except VtyUnreachable:
            continue
        except VtyError as e:
            raise SubstrateError(f"{node}: FRR {d} did not answer ({e})") from None
        if status == 0:
            out[d] = text
    return FrrView(out)


def root_qdisc(state: DeviceState, dev: str) -> str | None:
    """The root queueing discipline of ``dev`` in a capture, in canonical form
    (:func:`substrate.scenario.apply.qdisc_value`); None for none or the device's default (noqueue)."""
    for q in state.qdiscs:
        w = q.split(" ", 6)
        if len(w) >= 4 and w[0] == "dev" and w[1] == dev and w[2] == "root":
            kind = w[3]
            if kind == "noqueue":
                return None
            rate = None
            if kind == "tbf" and len(w) == 7:
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    rate = int(json.loads(w[6]).get("rate")) * 8  # tc -j gives bytes per second
            return qdisc_value(kind, rate)
    return None


def ingress_qdisc(state: DeviceState, dev: str) -> str | None:
    """The ingress-side qdisc of ``dev`` in a capture (``clsact``, ``ingress``), None for none."""
    for q in state.qdiscs:
        w = q.split(" ", 4)
        if len(w) >= 4 and w[0] == "dev" and w[1] == dev and w[2] in INGRESS_KINDS:
            return w[3]
    return None


def nexthop_key(args: str) -> str:
    """The key of a nexthop object (its ``nexthop add`` arguments): ``id N``."""
    return " ".join(args.split()[:2])


def value_of(state: DeviceState, frr: FrrView | None, kind: str, key: str) -> str | None:
    """The value of one item in a captured state (``frr`` for FRR items).

    Raises:
        ValueError: an FRR item without ``frr``.
    """
    if kind in ("route4", "route6"):
        routes = getattr(state, f"routes{kind[-1]}")
        # a route of the kernel's own class (proto kernel: local, broadcast, a prefix route) too,
        # which a reconciler's repair may put back or remove
        fam = f"-{kind[-1]} "
        kernel = [r[len(fam):] for r in state.kernel_routes if r.startswith(fam)]
        return next((r for r in [*routes, *kernel] if route_key(r) == key), None)
    if kind in ("rule4", "rule6"):
        return PRESENT if key in getattr(state, f"rules{kind[-1]}") else None
    if kind == "address":
        return PRESENT if key in state.addresses or key in state.host_addresses else None
    if kind == "link":
        ln = state.links.get(key)
        return None if ln is None else ("up" if ln.up else "down")
    if kind == "mtu":
        ln = state.links.get(key)
        return None if ln is None else str(ln.mtu)
    if kind == "nft":
        return nft_tables(state.nft).get(key)
    if kind == "sysctl":
        return state.sysctls.get(key, state.iface_sysctls.get(key))
    if kind == "tunsrc":
        return state.tunsrc or "::"
    if kind == "qdisc":
        return root_qdisc(state, key)
    if kind == "ingress":
        return ingress_qdisc(state, key)
    if kind in ("neigh4", "neigh6"):
        return next((n for n in state.neighbors if neigh_key(n) == key), None)
    if kind == "nexthop":
        return next((n for n in state.nexthops if nexthop_key(n) == key), None)
    if kind == "linkattr":
        dev, _, name = key.rpartition(" ")
        ln = state.links.get(dev)
        return None if ln is None else link_attrs(ln).get(name)
    if frr is None:
        raise ValueError("an FRR item needs the node's FRR configuration")
    head, _, line = key.partition(_FRR_SEP)
    return PRESENT if frr.has(head, line) else None


def items_of(delta: ConfigDelta, before: DeviceState, frr: FrrView | None) -> list[Item]:
    """The items ``delta`` sets on its node, with their values in ``before`` (and ``frr``, needed
    when the delta has FRR lines).

    Raises:
        ValueError: a command of the delta is not one this module knows how to undo.
    """
    want: dict[tuple[str, str], str | None] = {}
    for cmd in [*delta.removals, *delta.additions]:
        w = cmd.split()
        fam = w[0][1:] if w[0] in ("-4", "-6") else ""
        rest = w[1:] if fam else w
        verb, args = rest[:2], " ".join(rest[2:])
        if verb == ["route", "del"]:
            want[(f"route{fam}", route_key(args))] = None
        elif verb == ["route", "replace"] or verb == ["route", "add"]:
            want[(f"route{fam}", route_key(args))] = args
        elif verb[0] == "rule" and verb[1] in ("add", "del"):
            want[(f"rule{fam}", args)] = PRESENT if verb[1] == "add" else None
        elif verb[0] == "addr" and verb[1] in ("add", "replace", "del"):
            want[("address", args)] = None if verb[1] == "del" else PRESENT
        elif verb == ["link", "set"] and len(rest) == 4 and rest[3] in ("up", "down"):
            want[("link", rest[2])] = rest[3]
        elif verb == ["link", "set"] and len(rest) == 5 and rest[3] == "mtu" and rest[4].isdigit():
            want[("mtu", rest[2])] = rest[4]
        elif verb == ["link", "set"] and len(rest) == 5 and rest[3] in LINK_ATTRS:
            want[("linkattr", f"{rest[2]} {rest[3]}")] = rest[4]
        elif verb == ["link", "set"] and len(rest) == 4 and rest[3] == "nomaster":
            want[("linkattr", f"{rest[2]} master")] = ""
        elif fam == "6" and rest[:3] == ["sr", "tunsrc", "set"] and len(rest) == 4:
            want[("tunsrc", "")] = rest[3]
        elif fam and verb[0] == "neigh" and verb[1] in ("replace", "del"):
            want[(f"neigh{fam}", neigh_key(args))] = None if verb[1] == "del" else args
        elif not fam and verb[0] == "nexthop" and verb[1] in ("replace", "del"):
            want[("nexthop", nexthop_key(args))] = None if verb[1] == "del" else args
        else:
            raise ValueError(f"{delta.node}: cannot undo {cmd!r}")
    for table, text in delta.nft.items():
        want[("nft", table)] = text
    for path, v in delta.sysctls.items():
        want[("sysctl", path)] = v
    nested: dict[str, dict[str, str]] = {}
    for head, line, present in delta.frr_changes:
        want[("frr", _frr_key(head, line))] = PRESENT if present else None
        if not present and frr is not None and any(frr_nested(t, head, line) for t in frr.daemons.values()):
            # negating it deletes its nested lines too: each daemon's copy kept whole, for undo
            nested[_frr_key(head, line)] = {d: sub for d, t in sorted(frr.daemons.items()) if (sub := frr_subtree(t, head, line))}
    if frr is not None:
        # a stanza the change creates (its lines added under a head absent before) is an item of
        # its own, after its lines: undone as a whole (``no HEAD``), not left behind empty (a bare
        # ``route-map X permit 10``, a ``router bgp`` instance). Not an interface's: FRR does not
        # delete an interface that exists, its lines are undone one by one
        for head in dict.fromkeys(h for h, _, present in delta.frr_changes if h and present):
            if head not in frr.stanzas and not head.startswith("interface ") and ("frr", _frr_key("", head)) not in want:
                want[("frr", _frr_key("", head))] = PRESENT
    for dev, v in delta.qdiscs.items():
        want[("qdisc", dev)] = v
    for dev, v in delta.ingress.items():
        want[("ingress", dev)] = v
    return [Item(kind=k, key=key, before=value_of(before, frr, k, key), after=v,  # type: ignore[arg-type]
                 frr_daemons=nested.get(key) if k == "frr" else None) for (k, key), v in want.items()]


def delta_setting(node: str, items: list[tuple[Item, str | None]]) -> ConfigDelta:
    """The commands that give each item the value paired with it (removals tolerate an absent
    object; see :meth:`ConfigDelta.script`)."""
    d = ConfigDelta(node=node)
    for it, v in items:
        if it.kind in ("route4", "route6"):
            fam = it.kind[-1]
            if v is None:
                d.removals.append(f"-{fam} route del {it.key}")
            else:
                d.additions.append(f"-{fam} route replace {v}")
        elif it.kind in ("rule4", "rule6"):
            fam = it.kind[-1]
            (d.removals if v is None else d.additions).append(f"-{fam} rule {'del' if v is None else 'add'} {it.key}")
        elif it.kind == "address":
            (d.removals if v is None else d.additions).append(f"addr {'del' if v is None else 'replace'} {it.key}")
        elif it.kind == "link":
            if v is not None:
                (d.removals if v == "down" else d.additions).append(f"link set {it.key} {v}")
        elif it.kind == "mtu":
            if v is not None:
                d.additions.append(f"link set {it.key} mtu {v}")
        elif it.kind == "nft":
            d.nft[it.key] = v
        elif it.kind == "sysctl":
            if v is not None:
                d.sysctls[it.key] = v
        elif it.kind == "qdisc":
            d.qdiscs[it.key] = v
        elif it.kind == "tunsrc":
            d.additions.append(f"-6 sr tunsrc set {v or '::'}")
        elif it.kind == "ingress":
            d.ingress[it.key] = v
        elif it.kind == "linkattr":
            dev, _, name = it.key.rpartition(" ")
            if v is not None:
                d.additions.append(f"link set {dev} nomaster" if name == "master" and not v else f"link set {dev} {name} {v}")
        elif it.kind in ("neigh4", "neigh6"):
            fam = it.kind[-1]
            (d.removals if v is None else d.additions).append(f"-{fam} neigh {'del ' + it.key if v is None else 'replace ' + v}")
        elif it.kind == "nexthop":
            (d.removals if v is None else d.additions).append(f"nexthop {'del ' + it.key if v is None else 'replace ' + v}")
        else:
            head, _, line = it.key.partition(_FRR_SEP)
            d.frr_changes.append((head, line, v is not None))
    # a stanza removed whole takes its lines with it: negating them too would enter (re-create) it
    gone = {line for head, line, present in d.frr_changes if not head and not present}
    d.frr_changes = [(h, ln, p) for h, ln, p in d.frr_changes if not (h in gone and not p)]
    d.frr = frr_lines(d.frr_changes)
    return d


# -- the journal ---------------------------------------------------------------------------------------


class DeviceRecord(BaseModel):
    """One device of a transaction: the items its change sets."""

    node: str
    items: list[Item]
    script: str = Field(default="", description="The forward script (bash) as run on the device.")

    @property
    def has_frr(self) -> bool:
        return any(i.kind == "frr" for i in self.items)


class Mark(BaseModel):
    phase: str
    at: float
    note: str = ""


class DeviceUndo(BaseModel):
    """What undoing a change did on one device."""

    node: str
    restored: list[str] = Field(default_factory=list, description="Items put back to their value before the change.")
    residual: list[str] = Field(default_factory=list, description="Items not at their value before the change, with what differs.")
    pending: str | None = Field(default=None, description="Why the device could not be undone now (it did not answer): retried later.")


class UndoReport(BaseModel):
    devices: list[DeviceUndo] = Field(default_factory=list)

    @property
    def pending(self) -> list[str]:
        return [d.node for d in self.devices if d.pending]

    @property
    def complete(self) -> bool:
        return not any(d.pending or d.residual for d in self.devices)

    def residual(self) -> dict[str, list[str]]:
        return {d.node: [*([f"not undone yet: {d.pending}"] if d.pending else []), *d.residual]
                for d in self.devices if d.pending or d.residual}  # fmt: skip


class Entry(BaseModel):
    """One journaled transaction (see module docstring)."""

    schema_version: int = SCHEMA_VERSION
    id: str = Field(description="Unique within the lab's baseline epoch: '<owner>-<txn>'.")
    owner: str = Field(description="Who runs such transactions (e.g. 'a3t').")
    txn: str = Field(description="The owner's transaction id (A3-T: the change id).")
    epoch: str = Field(description="Baseline epoch of the lab (substrate.scenario.deploy.baseline_epoch).")
    holder: str = Field(description="The process running it.")
    phase: Phase
    history: list[Mark] = Field(default_factory=list)
    devices: list[DeviceRecord]
    payload: dict[str, Any] = Field(default_factory=dict, description="The owner's data (intent, draft result).")
    undo: UndoReport | None = None

    @property
    def tag(self) -> str:
        """``$0`` of the transaction's device scripts."""
        return f"anibench-txn:{self.epoch[:12]}:{self.id}"

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED

    def device(self, node: str) -> DeviceRecord:
        return next(d for d in self.devices if d.node == node)


def _epoch(lab: Lab) -> str:
    from substrate.scenario.deploy import baseline_epoch

    return baseline_epoch(lab)


def write_durable(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` atomically and durably: a temporary file written in full and
    fsync'd, renamed over ``path``, then the directory fsync'd (the rename survives a crash).

    Raises:
        OSError: not written (e.g. ENOSPC); ``path`` keeps its previous content, no temporary
            file is left.
    """
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            # write(2) may write less than asked (a file system nearly full writes what fits and
            # returns its count, the next call fails with ENOSPC): never rename a short file in
            rest = memoryview(text.encode())
            while rest:
                rest = rest[os.write(fd, rest):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class Journal:
    """The transactions of one owner in a lab's journal directory (host side)."""

    def __init__(self, lab: Lab, owner: str):
        if not re.fullmatch(r"[a-z0-9]+", owner):
            raise ValueError(f"journal owner must be lowercase letters and digits, got {owner!r}")
        self.lab = lab
        self.owner = owner
        self.dir = lab.dir / JOURNAL_DIR

    def _path(self, entry_id: str) -> Path:
        return self.dir / f"{entry_id}.json"

    def write(self, entry: Entry) -> None:
        """Persist ``entry`` durably (fsync'd file and directory).

        Raises:
            JournalError: the file could not be written.
        """
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            write_durable(self._path(entry.id), entry.model_dump_json())
        except OSError as e:
            raise JournalError(f"cannot write the transaction journal {self._path(entry.id)}: {e}") from None

    def begin(self, txn: str, devices: list[DeviceRecord], *, holder: str, payload: dict[str, Any]) -> Entry:
        """Journal a transaction about to touch ``devices`` (phase ``applying``). Call before the
        first device command.

        Raises:
            JournalError: not written; touch nothing.
        """
        e = Entry(id=f"{self.owner}-{txn}", owner=self.owner, txn=txn, epoch=_epoch(self.lab), holder=holder,
                  phase="applying", history=[Mark(phase="applying", at=time.time())], devices=devices, payload=payload)  # fmt: skip
        self.write(e)
        return e

    def mark(self, entry: Entry, phase: Phase, note: str = "") -> None:
        """Move ``entry`` to ``phase`` durably.

        Raises:
            JournalError.
        """
        entry.phase = phase
        entry.history.append(Mark(phase=phase, at=time.time(), note=note))
        self.write(entry)

    def get(self, txn: str) -> Entry | None:
        """The entry of transaction ``txn`` in the current epoch, or None."""
        e = _read(self._path(f"{self.owner}-{txn}"))
        return e if e is not None and e.epoch == _epoch(self.lab) else None

    def prune(self) -> int:
        """Delete this owner's finished entries of earlier baseline epochs (a lab reset made them
        moot). Returns how many."""
        epoch = _epoch(self.lab)
        n = 0
        for p in sorted(self.dir.glob(f"{self.owner}-*.json")):
            e = _read(p)
            if e is not None and e.owner == self.owner and e.epoch != epoch and e.finished:
                p.unlink(missing_ok=True)
                n += 1
        return n

    def unreadable(self) -> dict[str, str]:
        """This owner's journal files that cannot be read (damaged outside this module, which only
        renames whole files in): file name -> why. The transaction such a file recorded may be
        half-done on devices nobody can name now; only a lab reset (which removes the file, see
        :func:`remove_unreadable`) is sure to clear it."""
        out = {}
        for p in sorted(self.dir.glob(f"{self.owner}-*.json")):
            e, why = _read_why(p)
            if e is None:
                out[p.name] = why
        return out

    def unfinished(self) -> list[Entry]:
        """This owner's unfinished entries of the current epoch, oldest first."""
        epoch = _epoch(self.lab)
        out = [e for e in _entries(self.dir) if e.owner == self.owner and e.epoch == epoch and not e.finished]
        return sorted(out, key=lambda e: e.history[0].at if e.history else 0.0)


def _read_why(path: Path) -> tuple[Entry | None, str]:
    """The entry in ``path``, or None and why it cannot be read."""
    try:
        return Entry.model_validate_json(path.read_text()), ""
    except OSError as e:
        return None, str(e)
    except ValueError as e:
        first = str(e).splitlines()
        return None, f"not a journal entry: {first[1] if len(first) > 1 else first[0] if first else type(e).__name__}"[:200]


def _read(path: Path) -> Entry | None:
    return _read_why(path)[0]


def _entries(d: Path) -> list[Entry]:
    return [e for p in sorted(d.glob("*.json")) if (e := _read(p)) is not None]


def close_unfinished(lab: Lab, reason: str) -> list[str]:
    """Mark every unfinished transaction of ``lab`` (any owner, any epoch) ``abandoned``, with
    ``reason``. For lab reset, which puts every device back to the baseline itself (and kills
    every process left in the nodes, device scripts included). Returns the entry ids closed."""
    d = lab.dir / JOURNAL_DIR
    out = []
    for e in _entries(d):
        if not e.finished:
            e.phase = "abandoned"
            e.history.append(Mark(phase="abandoned", at=time.time(), note=reason))
            with contextlib.suppress(OSError):
                write_durable(d / f"{e.id}.json", e.model_dump_json())
                out.append(e.id)
    return out


def remove_unreadable(lab: Lab) -> dict[str, str]:
    """Delete the journal files of ``lab`` that cannot be read (any owner): for lab reset, once
    every device is back at its baseline. Returns file name -> why it could not be read."""
    out = {}
    for p in sorted((lab.dir / JOURNAL_DIR).glob("*.json")):
        e, why = _read_why(p)
        if e is None:
            with contextlib.suppress(OSError):
                p.unlink()
                out[p.name] = why
    return out


# -- device operations ---------------------------------------------------------------------------------


def run_script(lab: Lab, entry: Entry, node: str, script: str, timeout_s: float) -> str | None:
    """Run one of the transaction's device scripts (tagged, see module docstring). Returns None
    on success, else what went wrong (the command's error, no answer in time, or an FRR daemon
    that is not running: vtysh then drops its lines and still exits 0)."""
    try:
        r = lab.exec(node, ["bash", "-c", f"{script}\nexit $?", entry.tag], timeout_s=timeout_s)
    except SubstrateError as e:
        return str(e)
    if r.timed_out:
        return f"no answer within {timeout_s:g} s (frozen device or daemon?)"
    if not r.ok:
        return (r.stderr or r.stdout).strip()[-600:] or f"exit status {r.returncode}"
    down = re.findall(r"^(\S+) is not running$", r.stderr, re.M)
    if down:  # vtysh drops the lines meant for a daemon that is down, and exits 0
        return f"FRR {', '.join(down)} not running: configuration lines may not have been applied"
    return None


#: Kills every process whose argv has the tag (read from stdin, so that this script's own argv
#: does not), and their descendants, stopping each first so that none forks past the sweep.
_KILL_TAGGED = r"""read -r tag
all=" "
for d in /proc/[0-9]*; do
  p=${d#/proc/}; [ "$p" = "$$" ] && continue
  grep -qzxF -- "$tag" "$d/cmdline" 2>/dev/null && { kill -STOP "$p" 2>/dev/null; all="$all$p "; }
done
[ "$all" = " " ] && exit 0
more=1
while [ $more = 1 ]; do
  more=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$all" in *" $p "*) continue;; esac
    read -r st < "$d/stat" 2>/dev/null || continue
    set -- ${st##*) }
    case "$all" in *" $2 "*) kill -STOP "$p" 2>/dev/null; all="$all$p "; more=1;; esac
  done
done
kill -9 $all 2>/dev/null
echo "killed$all"
"""


def kill_scripts(lab: Lab, entry: Entry, nodes: list[str] | None = None) -> list[str]:
    """Kill the transaction's device scripts still running in ``nodes`` (default: its devices),
    with everything they started. Returns ``node: pids`` for each node where some were found."""

    def one(node: str) -> str | None:
        try:
            r = lab.exec(node, ["bash", "-c", _KILL_TAGGED], input=entry.tag + "\n", timeout_s=10)
        except SubstrateError:
            return None
        line = r.stdout.strip()
        return f"{node}:{line[len('killed'):]}" if line.startswith("killed") else None

    names = nodes if nodes is not None else [d.node for d in entry.devices]
    return [x for x in lab.map(one, names) if x]


def _current(lab: Lab, rec: DeviceRecord, capture_timeout_s: float) -> tuple[DeviceState, FrrView | None]:
    """The node's state now (kernel, and FRR when the record has FRR items).

    Raises:
        SubstrateError: the node or its FRR did not answer.
    """
    st = capture(lab, rec.node, frr=False, timeout_s=capture_timeout_s)
    frr = read_frr(lab, rec.node, timeout_s=min(2.0, capture_timeout_s)) if rec.has_frr else None
    return st, frr


def _describe(it: Item, now: str | None) -> str:
    def show(v: str | None) -> str:
        if v is None:
            return "absent"
        return "present" if v == PRESENT else repr(v if len(v) <= 160 else v[:157] + "...")

    return f"{it.label()}: now {show(now)}, before the change {show(it.before)}"


def undo_device(lab: Lab, entry: Entry, rec: DeviceRecord, *, capture_timeout_s: float = 8.0,
                device_timeout_s: float = 20.0) -> DeviceUndo:  # fmt: skip
    """Undo the change on one device: each item still holding the change's value goes back to its
    value before; an item at neither value was changed by someone else after us and is left
    alone (reported). Then reads the device again and reports every item not at its value
    before. Idempotent."""
    out = DeviceUndo(node=rec.node)
    try:
        st, frr = _current(lab, rec, capture_timeout_s)
    except SubstrateError as e:
        out.pending = str(e)
        return out
    todo: list[tuple[Item, str | None]] = []
    for it in rec.items:
        now = value_of(st, frr, it.kind, it.key)
        if same_value(it.kind, now, it.before):
            if differs := _nested_differ(it, frr):
                out.residual.append(_describe(it, now) + f" but its nested lines differ in FRR {', '.join(differs)} (changed by "
                                    "someone else after this change: left as it is)")  # fmt: skip
            continue
        if same_value(it.kind, now, it.after):
            todo.append((it, it.before))
        else:
            out.residual.append(_describe(it, now) + " (changed by someone else after this change: left as it is)")
    if not todo:
        return out
    # a removed FRR line with nested lines goes back whole, to each daemon that had it (FRR
    # first, as in a forward script: interface lines before the routes that use them)
    whole = [(it, v) for it, v in todo if it.frr_daemons and v is not None]
    errs = _restore_nested(lab, rec.node, frr, [it for it, _ in whole], timeout_s=device_timeout_s) if whole else []
    rest = [x for x in todo if x not in whole]
    if rest and (e := run_script(lab, entry, rec.node, delta_setting(rec.node, rest).script(), device_timeout_s)):
        errs.append(e)
    err = "; ".join(errs)
    try:
        st, frr = _current(lab, rec, capture_timeout_s)
    except SubstrateError as e:
        out.pending = f"{e} (after running the undo: {err or 'ok'})"
        return out
    for it, _ in todo:
        now = value_of(st, frr, it.kind, it.key)
        differs = _nested_differ(it, frr)
        if same_value(it.kind, now, it.before) and not differs:
            out.restored.append(it.label())
        else:
            out.residual.append(_describe(it, now) + (f" (its nested lines differ in FRR {', '.join(differs)})" if differs else "")
                                + (f" ({err})" if err else ""))  # fmt: skip
    return out


def _nested_differ(it: Item, frr: FrrView | None) -> list[str]:
    """The FRR daemons whose copy of item ``it`` (one removed with nested lines, present before the
    change: :attr:`Item.frr_daemons`) is not its copy before the change now, nested lines
    compared whatever their order (a daemon that holds it now and did not before included);
    [] for any other item, or while the line is absent."""
    if it.kind != "frr" or not it.frr_daemons or it.before is None or frr is None:
        return []
    head, _, line = it.key.partition(_FRR_SEP)
    if not frr.has(head, line):
        return []
    return sorted(d for d in set(it.frr_daemons) | set(frr.daemons)
                  if daemon_config_lines(frr_subtree(frr.daemons.get(d, ""), head, line)) != daemon_config_lines(it.frr_daemons.get(d, "")))


def _restore_nested(lab: Lab, node: str, now: FrrView | None, items: list[Item], *, timeout_s: float) -> list[str]:
    """Put each of ``items`` (FRR lines removed with their nested lines, absent now) back as each
    daemon had it before the change (:attr:`Item.frr_daemons`): the commands of
    :func:`substrate.devstate.frr_daemon_delta` on that daemon's own vty socket, one session per
    daemon and item, so that no daemon gets lines it did not have (vtysh would send a
    ``route-map`` to every daemon that knows the command). Returns errors (a command a daemon
    refused, a daemon that did not answer); [] when every command was taken."""
    from substrate.vty import VtyError

    errors: list[str] = []
    for it in items:
        head, _, line = it.key.partition(_FRR_SEP)
        for d, want in sorted((it.frr_daemons or {}).items()):
            cmds = frr_daemon_delta(frr_subtree((now.daemons if now else {}).get(d, ""), head, line), want)
            if not cmds:
                continue
            try:
                answers = lab.vty(node, d, *cmds, timeout_s=timeout_s)
            except VtyError as e:
                errors.append(f"FRR {d}: {e}")
                continue
            errors += [f"FRR {d}: {cmd!r} refused: {text.strip()[:200]}" for cmd, (text, status) in zip(cmds, answers, strict=True)
                       if status != 0]  # fmt: skip
    return errors


def undo(lab: Lab, entry: Entry, nodes: list[str] | None = None, *, capture_timeout_s: float = 8.0,
         device_timeout_s: float = 20.0) -> UndoReport:  # fmt: skip
    """Undo the transaction on ``nodes`` (default: all its devices), in parallel (see
    :func:`undo_device`)."""
    recs = [d for d in entry.devices if nodes is None or d.node in nodes]
    done = lab.map(lambda r: undo_device(lab, entry, r, capture_timeout_s=capture_timeout_s,
                                         device_timeout_s=device_timeout_s), recs)  # fmt: skip
    return UndoReport(devices=done)


def state_matches(lab: Lab, entry: Entry, which: Literal["before", "after"], *, capture_timeout_s: float = 8.0) -> dict[str, list[str]]:
    """Per device, the items not at their ``which`` value now (empty: every device matches)."""

    def one(rec: DeviceRecord) -> list[str]:
        try:
            st, frr = _current(lab, rec, capture_timeout_s)
        except SubstrateError as e:
            return [str(e)]
        return [_describe(it, now) for it in rec.items
                if not same_value(it.kind, now := value_of(st, frr, it.kind, it.key), getattr(it, which))
                or (which == "before" and _nested_differ(it, frr))]  # fmt: skip

    got = lab.map(one, entry.devices)
    return {r.node: x for r, x in zip(entry.devices, got, strict=True) if x}


def persist_frr(lab: Lab, entry: Entry, timeout_s: float = 10.0) -> list[str]:
    """Write the transaction's FRR lines into each touched router's startup configuration
    (:func:`substrate.frr.edit_startup_config`), as an operator saves a configuration change
    (``write memory``). Idempotent. Returns errors (empty: every file written)."""
    from substrate.frr import STARTUP_CONFIG, edit_startup_config

    def one(rec: DeviceRecord) -> str | None:
        changes = []
        for it in rec.items:
            if it.kind == "frr":
                head, _, line = it.key.partition(_FRR_SEP)
                changes.append((head, line, it.after is not None))
        try:
            if lab.state(rec.node).role is Role.HOST or not changes:
                return None
            # tagged like the device scripts, so that recovery kills a dead server's commands here too
            # ('; exit $?': bash would exec a lone command in its own place, and the tag with it)
            r = lab.exec(rec.node, ["bash", "-c", f"cat {STARTUP_CONFIG}; exit $?", entry.tag], timeout_s=timeout_s)
            if not r.ok:
                return f"{rec.node}: cannot read {STARTUP_CONFIG}: {r.summary()}"
            new = edit_startup_config(r.stdout, changes)
            if new == r.stdout:
                return None
            tmp = f"{STARTUP_CONFIG}.anibench"
            w = lab.exec(rec.node, ["bash", "-c", f"umask 027; cat > {tmp} && chown frr:frr {tmp} && mv -f {tmp} {STARTUP_CONFIG}; "
                                    "exit $?", entry.tag], input=new, timeout_s=timeout_s)  # fmt: skip
        except SubstrateError as e:
            return f"{rec.node}: {e}"
        return None if w.ok else f"{rec.node}: cannot write {STARTUP_CONFIG}: {w.summary()}"

    return [e for e in lab.map(one, [d for d in entry.devices if d.has_frr]) if e]


def snapshot(lab: Lab, node: str, delta: ConfigDelta, *, capture_timeout_s: float = 8.0) -> DeviceRecord:
    """The device record of ``delta``: its items with their values read from ``node`` now.

    Raises:
        SubstrateError: the node (or its FRR, when the delta has FRR lines) did not answer.
        ValueError: the delta has a command this module cannot undo.
    """
    st = capture(lab, node, frr=False, timeout_s=capture_timeout_s)
    frr = read_frr(lab, node, timeout_s=min(2.0, capture_timeout_s)) if delta.frr_changes else None
    return DeviceRecord(node=node, items=items_of(delta, st, frr), script=delta.script())


def entry_json(entry: Entry) -> dict[str, Any]:
    """The entry as JSON data (for reports)."""
    return json.loads(entry.model_dump_json())


__all__ = [
    "DeviceRecord", "DeviceUndo", "Entry", "Item", "Journal", "JournalError", "UndoReport", "close_unfinished",
    "delta_setting", "items_of", "kill_scripts", "normalize_nft_table", "normalize_route", "persist_frr", "read_frr",
    "remove_unreadable", "run_script", "same_value", "write_durable", "snapshot", "state_matches", "undo", "undo_device", "value_of",
]  # fmt: skip
