"""The observer: checks invariants and task test cases out-of-band, through the substrate
(draft section 4.6) -- never through an ANI server -- in parallel, with bounded timeouts, and
returns a verdict with evidence (command, exit code, output excerpt) for each.

Check kinds (``Invariant.kind``):

- ``reach`` {src, dst, family, dst_node}: real pings from host ``src`` reach ``dst`` (retried);
  with ``dst_node``, they must also arrive at that host, counted there like ``reach_at`` (a
  router answering for the address is not the site: issue 36);
- ``reach_at`` {src, dst, family, dst_node, dst_at}: pings from ``src`` to ``dst`` get replies and
  arrive at host ``dst_node`` addressed to ``dst_at`` (after any NAT; default ``dst``);
- ``isolated`` {src, dst, family, dst_node}: no ping from ``src`` gets an answer from ``dst``,
  and none arrives at host ``dst_node`` when given (counted there: a one-way leak fails);
- ``steered_path`` {src, dst, family, node, sid, count}: ``count`` pings from ``src`` to ``dst``
  raise the packet counter of SID ``sid`` on ``node`` by at least ``count`` and get replies (the
  SID is used by this policy only, and the checks of one SID -- a policy's IPv6 and IPv4 flows --
  never measure at the same time, so concurrent probes cannot fake it; retried like ``reach``);
- ``tcp_verdict`` {src, dst, port, expect}: a TCP connection attempt from ``src`` reaches the
  destination host (connected or reset by it) when ``expect`` is ``allow``; times out (dropped)
  when ``deny``;
- ``isis_adjacency`` {node, interface, neighbor}: FRR reports the adjacency Up;
- ``sid_bound`` {node, sid, action, ...}: a seg6local route for ``sid`` with that action and
  parameters (``table``, ``nh4``, ``flavors``) exists in the main table;
- ``sid_unbound`` {node, sid, action, ...}: no seg6local route for ``sid`` with that action and
  those parameters (the binding a change retires is gone; the function may serve another
  service since);
- ``fib_has`` {node, prefixes}: the node's main table has a route for every prefix;
- ``nft_rule`` {node, table, contains}: one line of the nftables table contains every string;
- ``route_absent`` {node, table, prefixes, rules_iif, interface, addresses}: no route in routing
  table ``table`` of the node for any of ``prefixes`` (IPv6 or IPv4; a SID in table ``main``), no
  policy rule matching input interface ``rules_iif`` leads to that table, and ``interface`` holds
  none of ``addresses`` (what a decommissioned site, a moved site's old circuit or a tenant
  leaving a PE must leave behind: nothing);
- ``table_routes`` {node, table, family, routes}: routing table ``table`` of the node holds
  exactly ``routes`` (rendered ``ip route`` arguments), compared by type, destination and
  forwarding (SRv6 segments, or output device): a route missing, pointing elsewhere, or one no
  service rendered (a typo'd prefix, a leftover of a site that left) fails it -- forwarding that
  works by luck is not scored as correct configuration (issue 19);
- ``nft_tables`` {node, tables}: the node holds exactly the nftables tables ``tables``
  (``"FAMILY NAME"``, as rendered) and no other, less what is put there below the ANI on purpose
  and judged so by its content (:func:`nft_table_below_ani`: the observer's arrival table, a
  cleared latency fault's empty ``mangle`` table) and empty tables (no chain, set or rule: they
  see no packet). A table the scenario renders on another node
  (a floating-IP NAT on a PE that is not the border) or under another name is caught here,
  whatever chains sample it (issue 19);
- ``nft_chain`` {node, table, chain, rules} / {node, table, chains}: chain ``chain`` of nftables
  table ``table`` (``"inet tenant_fw"``) on the node holds exactly ``rules`` -- its lines in
  evaluation order (any order with ``ordered: false``), a base chain's declaration first, compared normalized
  (:func:`nft_chain_lines`: handles and counters stripped, whitespace and hexadecimal numbers
  canonical); without ``chain``, the table holds exactly the chains ``chains`` (none: no such
  table). Reach and deny probes sample ports and pairs; a rule added where none samples (a drop
  on another port, a table on a PE that has none, a DNAT of a spare address) fails these;
- ``policy_rules`` {node, family, rules}: the node's policy rules are exactly the rendered ones
  plus the kernel's defaults (:func:`check_policy_rules`; issue 36);
- ``local_sids`` {node, sids}: the node's ``/64`` SIDs bind exactly the rendered behaviours,
  whatever function serves each (:func:`check_local_sids`; issue 36);
- ``port_state`` {node, ports}: each customer-facing port has the links' MTU and the root qdisc
  kind rendered there (:func:`check_port_state`; issue 36);
- ``address_bound`` {node, interface, addresses}: the interface holds every address
  (``ADDR/LEN``), e.g. a PE's end of an attachment circuit -- which a CE's neighbour cache can
  hide the loss of (issue 19).

Probes see the network as a new packet would: every pass with data-plane checks first flushes
the neighbour caches (IPv6 and IPv4, every state) of every host node, so a CE cannot keep
reaching a PE address that is gone through a cached entry (issue 19: a PE circuit renumbered
from ``fd10::1/64`` to ``fd10::77/64`` was scored clean). A host whose cache cannot be flushed
fails every check probing from it, with the reason.

Service classes add kinds of their own (``ServiceClass.checks``, :func:`class_checks`);
:mod:`substrate.scenario.device_checks` adds the generic ``output_check`` and ``json_value``
(a diagnostic command and a deterministic predicate on its output).

Read-only commands whose output several checks share (routing table, IS-IS neighbours, an nft
table) run once per node and observation pass.
"""

from __future__ import annotations

import ipaddress
import json
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from substrate.scenario.model import Invariant

if TYPE_CHECKING:
    from substrate.lab import Lab
    from substrate.process import ExecResult

#: Show commands answered from a daemon's vty socket: second word -> daemon.
_VTY_DAEMONS = {"isis": "isisd"}
#: Threads of one observation pass: most checks wait on the network, not on the CPU.
WORKERS = 48
#: A reachability check tries this many times (2 pings, 1 s wait each) before failing: a loaded
#: 2-core machine can delay a reply, and a failed check costs what success never does.
REACH_ATTEMPTS = 3
#: Least time between the starts of two reachability attempts (seconds).
REACH_SPACING_S = 1.0
#: TCP attempts that must reach the host wait long enough for one SYN retransmission (1 s).
TCP_ALLOW_TIMEOUT_S = 2.5
TCP_DENY_TIMEOUT_S = 1.0
EXCERPT = 400


class Evidence(BaseModel):
    """What a verdict rests on."""

    node: str = ""
    command: str = ""
    exit_code: int | None = None
    output: str = Field(default="", description="Excerpt of the output (bounded).")


class Verdict(BaseModel):
    """Outcome of one check."""

    id: str
    kind: str
    service: str
    ok: bool
    detail: str = Field(default="", description="One line saying why.")
    evidence: list[Evidence] = Field(default_factory=list)
    duration_s: float = 0.0
    diff: dict[str, list[str]] | None = Field(
        default=None, description="State checks (table_routes, address_bound, nft_chain): what the node lacks ('missing') and "
        "holds beyond what was rendered ('unexpected'), unbounded and structured, for diagnostics "
        "(harness.diagnostics); None for other kinds.")


#: Check kinds that send probes from a host (``src``): their hosts' neighbour caches are flushed
#: first. Service classes' data-plane kinds name themselves in ``ServiceClass.probe_kinds``.
PROBE_KINDS = frozenset({"reach", "reach_at", "isolated", "steered_path", "tcp_verdict"})
#: Payload sizes of isolation probes start here (ping's default is 56; sizes stay under the
#: 1280-byte IPv6 minimum MTU minus the SRv6 encapsulation for a few hundred probes).
PROBE_SIZE_MIN, PROBE_SIZE_MAX = 100, 1100
#: The flush: every neighbour entry of both families, whatever its state (iproute2 ip-neighbour).
FLUSH_NEIGHBOURS = "ip -6 neigh flush all nud all; ip -4 neigh flush all nud all"
#: The nftables table a receiving host counts probes in during one pass (:class:`_Arrivals`).
ARRIVAL_TABLE = "anibench_probe"
#: Its ruleset: in prerouting at priority -400 (ahead of any filter or NAT), every echo request
#: adds to a counter keyed by its destination address and packet length (network header on), so
#: that each probe -- of a length unique in the pass -- is counted apart, with no rule of its own.
#: Any table of that name (a pass killed half-way) is replaced in the same transaction.
_ARRIVAL_RULESET = f"""table inet {ARRIVAL_TABLE}
delete table inet {ARRIVAL_TABLE}
table inet {ARRIVAL_TABLE} {{
\tset seen4 {{ typeof ip daddr . meta length; flags dynamic; counter; }}
\tset seen6 {{ typeof ip6 daddr . meta length; flags dynamic; counter; }}
\tchain c {{
\t\ttype filter hook prerouting priority -400; policy accept;
\t\ticmp type echo-request update @seen4 {{ ip daddr . meta length }}
\t\ticmpv6 type echo-request update @seen6 {{ ip6 daddr . meta length }}
\t}}
}}
"""


def is_probe_table(blocks: dict[str, list[str]]) -> bool:
    """Whether an nftables table, as the device lists it normalized block by block
    (``{"chain c": [lines]}``: :func:`substrate.journal.nft_blocks`), is the observer's
    arrival table (:data:`_ARRIVAL_RULESET`): its two counting sets and its one chain of exactly its
    two ``update`` rules under policy accept -- nothing that drops or changes a packet. Judged by
    content: a table of that name holding anything else is not the observer's."""
    chain = ["type filter hook prerouting priority -400; policy accept;",
             "icmp type echo-request update @seen4 { ip daddr . meta length }",
             "icmpv6 type echo-request update @seen6 { ip6 daddr . meta length }"]  # fmt: skip
    heads = {h for h, ls in blocks.items() if h or ls}
    return heads == {"set seen4", "set seen6", "chain c"} and blocks["chain c"] == chain and \
        blocks["set seen4"][:1] == ["typeof ip daddr . meta length"] and blocks["set seen6"][:1] == ["typeof ip6 daddr . meta length"]


class _Arrivals:
    """The arrival counters of one receiving host for one pass: its table is created by the first
    probe toward it (again by the next one if that failed) and deleted when the pass ends
    (:meth:`ObserveContext.close`); a read serves every probe that ended before it started, so
    concurrent probes toward one host share it. Before, each probe added a table of its own and
    read and deleted it: three nft processes per probe, the largest CPU cost of a pass."""

    def __init__(self, ctx: ObserveContext, receiver: str):
        self.ctx, self.receiver = ctx, receiver
        self.created = False
        self._lock = threading.Lock()
        self._read_at = -1.0
        self._read: tuple[dict[tuple[str, int], int] | None, ExecResult] | None = None

    def ensure(self) -> ExecResult | None:
        """Create the table unless it exists; the failed ``nft -f`` when it cannot be."""
        with self._lock:
            if self.created:
                return None
            r = self.ctx.lab.exec(self.receiver, ["nft", "-f", "-"], input=_ARRIVAL_RULESET, timeout_s=10)
            self.created = r.returncode == 0
            return None if self.created else r

    def count(self, dst_at: str, length: int, since: float) -> tuple[int | None, ExecResult]:
        """Echo requests to ``dst_at`` of ``length`` bytes counted at the receiver by a read that
        started after ``since`` (monotonic seconds: when the probe ended); None when the table
        could not be read."""
        with self._lock:
            if self._read is None or self._read_at < since:
                self._read_at = time.monotonic()
                r = self.ctx.run(self.receiver, ["nft", "-j", "list", "table", "inet", ARRIVAL_TABLE], timeout_s=10)
                self._read = (_arrival_counts(r.stdout) if r.returncode == 0 else None, r)
            counts, r = self._read
        key = (ipaddress.ip_address(dst_at).compressed, length)
        return (None if counts is None else counts.get(key, 0)), r


def _arrival_counts(text: str) -> dict[tuple[str, int], int] | None:
    """(address, length) -> packets, from ``nft -j list table inet anibench_probe``; None when
    the output is not that table."""
    try:
        items = json.loads(text)["nftables"]
    except (ValueError, KeyError, TypeError):
        return None
    out: dict[tuple[str, int], int] = {}
    sets = [x["set"] for x in items if isinstance(x, dict) and "set" in x]
    if {s.get("name") for s in sets} != {"seen4", "seen6"}:
        return None
    for st in sets:
        for e in st.get("elem", []):
            e = e.get("elem", e) if isinstance(e, dict) else e
            try:
                addr, length = e["val"]["concat"]
                out[(ipaddress.ip_address(addr).compressed, int(length))] = int(e["counter"]["packets"])
            except (KeyError, TypeError, ValueError):
                return None
    return out


class ObserveContext:
    """One observation pass: the lab plus a cache of shared read-only command outputs."""

    def __init__(self, lab: Lab):
        self.lab = lab
        #: Hosts whose neighbour cache could not be flushed -> the failed flush.
        self.unflushed: dict[str, ExecResult] = {}
        #: Invariant id -> the structured difference a state check found (Verdict.diff).
        self.diffs: dict[str, dict[str, list[str]]] = {}
        self._sizes = iter(range(PROBE_SIZE_MIN, PROBE_SIZE_MAX))
        self._arrivals: dict[str, _Arrivals] = {}
        self._cache: dict[tuple[str, tuple[str, ...]], ExecResult] = {}
        self._locks: dict[tuple[str, tuple[str, ...]], threading.Lock] = {}
        self._guard = threading.Lock()

    def exclusive(self, *key: str) -> threading.Lock:
        """A lock of this pass named by ``key``: checks that read one shared counter (a SID's
        packet count) hold it while they measure, so they cannot count each other's probes."""
        with self._guard:
            return self._locks.setdefault(("exclusive", key), threading.Lock())

    def probe_size(self) -> int:
        """A payload size (bytes) no other isolation probe of this pass uses.

        Raises:
            StopIteration: the pass has more isolation probes than sizes (the check then fails
                with the reason, :func:`check_one`).
        """
        with self._guard:
            return next(self._sizes)

    def arrivals(self, receiver: str) -> _Arrivals:
        """The arrival counters of host ``receiver`` in this pass (:class:`_Arrivals`)."""
        with self._guard:
            return self._arrivals.setdefault(receiver, _Arrivals(self, receiver))

    def close(self, pool: ThreadPoolExecutor | None = None) -> None:
        """End the pass: delete the arrival tables it created (in parallel on ``pool``)."""
        with self._guard:
            made = [a.receiver for a in self._arrivals.values() if a.created]
            self._arrivals.clear()

        def drop(h: str) -> None:
            self.run(h, ["nft", "delete", "table", "inet", ARRIVAL_TABLE], timeout_s=10)

        if pool is None:
            for h in made:
                drop(h)
        else:
            list(pool.map(drop, made))

    def run(self, node: str, argv: list[str], timeout_s: float = 10.0) -> ExecResult:
        return self.lab.exec(node, argv, timeout_s=timeout_s, max_output=1 << 20)

    def shared(self, node: str, argv: list[str], timeout_s: float = 10.0) -> ExecResult:
        """Run a read-only command once per pass; concurrent callers wait for the first.

        ``["vtysh", "-c", CMD]`` for an isisd or zebra show command goes to the daemon's vty
        socket instead of starting vtysh (same answer, a fraction of the cost; substrate.vty).
        """
        key = (node, tuple(argv))
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._cache:
                self._cache[key] = self._vty(node, argv, timeout_s) or self.run(node, argv, timeout_s)
            return self._cache[key]

    def _vty(self, node: str, argv: list[str], timeout_s: float) -> ExecResult | None:
        from substrate.process import ExecResult
        from substrate.vty import VtyError

        if len(argv) != 3 or argv[:2] != ["vtysh", "-c"]:
            return None
        words = argv[2].split()
        daemon = _VTY_DAEMONS.get(words[1]) if len(words) > 1 and words[0] == "show" else None
        if daemon is None:
            return None
        t0 = time.monotonic()
        try:
            text, status = self.lab.vty(node, daemon, argv[2], timeout_s=timeout_s)[0]
        except VtyError as e:
            return ExecResult(node=node, argv=argv, returncode=1, stdout="", stderr=str(e), duration_s=time.monotonic() - t0)
        return ExecResult(node=node, argv=argv, returncode=status, stdout=text, stderr="", duration_s=time.monotonic() - t0)


def _ev(r: ExecResult, command: str | None = None) -> Evidence:
    text = (r.stdout + ("\n" + r.stderr if r.stderr.strip() else "")).strip()
    return Evidence(node=r.node, command=command or " ".join(r.argv), exit_code=r.returncode, output=text[:EXCERPT])


def _received(out: str) -> int:
    m = re.search(r"(\d+) (?:packets )?received", out)
    return int(m.group(1)) if m else 0


def _ping(ctx: ObserveContext, src: str, dst: str, family: int, count: int, wait: float, interval: float = 0.2) -> ExecResult:
    argv = ["ping", f"-{family}", "-n", "-q", "-c", str(count), "-i", str(interval), "-W", str(wait), dst]
    return ctx.run(src, argv, timeout_s=count * interval + wait + 5)


def _spaced(attempt: Callable[[], tuple[bool, str, list[Evidence], bool]]) -> tuple[bool, str, list[Evidence]]:
    """Run a data-plane ``attempt`` up to REACH_ATTEMPTS times, REACH_SPACING_S apart, until it
    passes or says a retry cannot help; returns the last verdict with every attempt's evidence.

    An ICMP error ends ping at once and the first packets after a link or neighbour change can be
    lost (neighbour discovery failing right after a link came back): spacing the attempts makes
    them span such a transient, while a real break fails them all.
    """
    ev: list[Evidence] = []
    for k in range(REACH_ATTEMPTS):
        t0 = time.monotonic()
        ok, detail, e, retry = attempt()
        ev += e
        if ok or not retry or k + 1 == REACH_ATTEMPTS:
            return ok, detail, ev
        time.sleep(max(0.0, REACH_SPACING_S - (time.monotonic() - t0)))
    raise AssertionError("unreachable")  # pragma: no cover


def check_reach(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    """Pings from ``src`` to ``dst`` get replies; when the invariant names the destination host
    (``dst_node``), they must also arrive there (:func:`check_reach_at`): a router answering
    for the address (the CE's address put on a PE, a ``local`` route in a tenant table) is not
    the site (issue 36, adversarial finding A3). Retried (:func:`_spaced`)."""
    p = inv.params
    if p.get("dst_node"):
        return check_reach_at(ctx, inv)

    def attempt() -> tuple[bool, str, list[Evidence], bool]:
        r = _ping(ctx, p["src"], p["dst"], int(p.get("family", 6)), 2, 1.0)
        ok = _received(r.stdout) > 0
        return ok, f"{p['src']} -> {p['dst']}: {'replies received' if ok else 'no reply'}", [_ev(r)], True

    return _spaced(attempt)


def _arrival_rule(family: int, dst: str, length: int) -> str:
    """The nft match of one isolation probe at its receiver: an echo request to ``dst`` whose
    packet length (network header on) is ``length`` -- unique per probe in a pass."""
    if family == 6:
        return f"ip6 daddr {dst} icmpv6 type echo-request meta length {length}"
    return f"ip daddr {dst} icmp type echo-request meta length {length}"


def check_isolated(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    """No reply comes back, and -- when the invariant names the receiving host (``dst_node``) --
    no probe arrives there either: a counter in the receiver's namespace (nftables, prerouting,
    ahead of any filter) counts the echo requests of this probe, told apart from every other
    packet by a payload size unique in the pass. A one-way leak (requests delivered, replies
    dropped or unroutable) fails it (issue 19)."""
    p = inv.params
    fam = int(p.get("family", 6))
    receiver = p.get("dst_node")
    if not receiver:
        r = _ping(ctx, p["src"], p["dst"], fam, 2, 0.5)
        got = _received(r.stdout)
        return got == 0, f"{p['src']} -> {p['dst']}: {got} replies (expected none)", [_ev(r)]
    counted = _counted_ping(ctx, p["src"], p["dst"], fam, receiver, p["dst"])
    if len(counted) == 2:
        return False, str(counted[0]), list(counted[1])
    got, arrived, ev = counted  # type: ignore[misc]
    ok = got == 0 and arrived == 0
    return ok, f"{p['src']} -> {p['dst']} ({receiver}): {arrived} probes arrived, {got} replies (expected none)", ev


def _counted_ping(ctx: ObserveContext, src: str, dst: str, fam: int, receiver: str, dst_at: str,
                  count: int = 2) -> tuple[int, int, list[Evidence]] | tuple[str, list[Evidence]]:
    """``count`` pings from ``src`` to ``dst``, each counted on arrival at ``receiver`` (its
    arrival counters, :class:`_Arrivals`: prerouting at priority -400, ahead of any filter or NAT)
    as an echo request to ``dst_at`` (``dst`` itself, or the address a NAT on the way rewrote it
    to) whose length is unique in the pass. Returns (replies, arrivals, evidence), or
    (why the check could not run, evidence)."""
    size = ctx.probe_size()
    length = size + (48 if fam == 6 else 28)
    counters = ctx.arrivals(receiver)
    r0 = counters.ensure()
    if r0 is not None:
        return f"check could not run: no arrival counter on {receiver}", [_ev(r0, f"nft -f - # {ARRIVAL_TABLE}")]
    argv = ["ping", f"-{fam}", "-n", "-q", "-c", str(count), "-i", "0.2", "-W", "0.5", "-s", str(size), dst]
    r = ctx.run(src, argv, timeout_s=7)
    got = _received(r.stdout)
    arrived, r1 = counters.count(dst_at, length, since=time.monotonic())
    cmd = f"nft -j list table inet {ARRIVAL_TABLE} # {dst_at} length {length}"
    if arrived is None:
        return f"check could not run: the arrival counter on {receiver} could not be read", [_ev(r), _ev(r1, cmd)]
    return got, arrived, [_ev(r), Evidence(node=receiver, command=cmd, exit_code=r1.returncode,
                                           output=f"echo requests of this probe counted at {receiver}: {arrived}")]


def check_reach_at(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    """Pings from ``src`` to ``dst`` get replies *and* arrive at host ``dst_node`` as packets to
    ``dst_at`` (default ``dst``): a floating IP NATed to the wrong CE answers too, from the wrong
    host; this check tells them apart (retried like ``reach``)."""
    p = inv.params
    fam = int(p.get("family", 6))

    def attempt() -> tuple[bool, str, list[Evidence], bool]:
        counted = _counted_ping(ctx, p["src"], p["dst"], fam, p["dst_node"], p.get("dst_at") or p["dst"])
        if len(counted) == 2:
            return False, str(counted[0]), list(counted[1]), True
        got, arrived, ev = counted  # type: ignore[misc]
        ok = got > 0 and arrived > 0
        return ok, (f"{p['src']} -> {p['dst']}: {got} replies, {arrived} probes arrived at {p['dst_node']}"
                    f" (expected both)"), ev, True

    return _spaced(attempt)


def _sid_packets(ctx: ObserveContext, node: str, sid: str) -> tuple[int | None, ExecResult]:
    r = ctx.run(node, ["ip", "-6", "-s", "-j", "route", "show", "table", "main", sid])
    try:
        entries = [e for e in json.loads(r.stdout or "[]") if e.get("encap") == "seg6local"]
    except ValueError:
        return None, r
    if not entries or "stats64" not in entries[0]:
        return None, r
    return int(entries[0]["stats64"]["packets"]), r


def check_steered_path(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    p = inv.params
    count = int(p.get("count", 5))

    def attempt() -> tuple[bool, str, list[Evidence], bool]:
        with ctx.exclusive(p["node"], p["sid"]):
            before, r0 = _sid_packets(ctx, p["node"], p["sid"])
            if before is None:
                return False, f"{p['sid']} is not installed (with counters) on {p['node']}", [_ev(r0)], False
            r = _ping(ctx, p["src"], p["dst"], int(p.get("family", 6)), count, 1.0, interval=0.05)
            after, r1 = _sid_packets(ctx, p["node"], p["sid"])
        delta = (after or 0) - before
        got = _received(r.stdout)
        ok = delta >= count and got > 0
        detail = f"{count} probes {p['src']} -> {p['dst']}: {got} replies; {p['node']} {p['sid']} counted {delta}"
        return ok, detail, [_ev(r), _ev(r1)], True

    return _spaced(attempt)


_TCP = "timeout {t} bash -c 'exec 3<>/dev/tcp/{dst}/{port}' 2>&1; echo \"rc=$?\""


def check_tcp_verdict(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    p = inv.params
    t = float(p.get("timeout_s", TCP_ALLOW_TIMEOUT_S if p["expect"] == "allow" else TCP_DENY_TIMEOUT_S))
    cmd = _TCP.format(t=t, dst=p["dst"], port=int(p["port"]))
    r = ctx.run(p["src"], ["bash", "-c", cmd], timeout_s=t + 5)
    out = r.stdout
    rc = re.search(r"rc=(\d+)", out)
    code = int(rc.group(1)) if rc else -1
    if code == 0 or "Connection refused" in out:
        seen = "reached"
    elif code == 124:
        seen = "dropped"
    else:
        seen = "unreachable"
    want = "reached" if p["expect"] == "allow" else "dropped"
    return seen == want, f"TCP {p['src']} -> [{p['dst']}]:{p['port']}: {seen} (expected {want})", [_ev(r, cmd)]


def _routes(ctx: ObserveContext, node: str) -> tuple[list[dict[str, Any]], ExecResult]:
    r = ctx.shared(node, ["ip", "-6", "-d", "-j", "route", "show", "table", "main"])
    try:
        return json.loads(r.stdout or "[]"), r
    except ValueError:
        return [], r


def check_sid_bound(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    p = inv.params
    routes, r = _routes(ctx, p["node"])
    for e in routes:
        if e.get("dst") == p["sid"] and e.get("encap") == "seg6local":
            mism = [k for k in ("action", "table", "nh4", "flavors") if k in p and str(e.get(k)) != str(p[k])]
            if not mism:
                return True, f"{p['sid']} on {p['node']} is {p['action']}", [_ev(r, f"ip -6 -d -j route show table main # {p['sid']}")]
            return False, f"{p['sid']} on {p['node']}: " + ", ".join(f"{k}={e.get(k)!r} (expected {p[k]!r})" for k in mism), [
                Evidence(node=p["node"], command=f"ip -6 -d -j route show table main # {p['sid']}", exit_code=r.returncode,
                         output=json.dumps(e)[:EXCERPT])]
    return False, f"{p['sid']} is not installed on {p['node']}", [_ev(r, f"ip -6 -d -j route show table main # {p['sid']}")]


def check_sid_unbound(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    p = inv.params
    routes, r = _routes(ctx, p["node"])
    cmd = f"ip -6 -d -j route show table main # {p['sid']}"
    for e in routes:
        if e.get("dst") == p["sid"] and e.get("encap") == "seg6local" and \
                all(str(e.get(k)) == str(p[k]) for k in ("action", "table", "nh4") if k in p):
            return False, f"{p['sid']} on {p['node']} is still {p['action']}" + "".join(
                f" {k} {p[k]}" for k in ("table", "nh4") if k in p), [
                Evidence(node=p["node"], command=cmd, exit_code=r.returncode, output=json.dumps(e)[:EXCERPT])]
    return True, f"{p['sid']} on {p['node']}: no {p['action']} binding left", [_ev(r, cmd)]


def check_fib_has(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    p = inv.params
    routes, r = _routes(ctx, p["node"])
    have = {e.get("dst", "") if "/" in e.get("dst", "") else f"{e.get('dst')}/128" for e in routes}
    missing = [x for x in p["prefixes"] if x not in have]
    detail = f"{p['node']}: all {len(p['prefixes'])} prefixes present" if not missing else \
        f"{p['node']} lacks {len(missing)}: {', '.join(missing[:5])}"
    return not missing, detail, [Evidence(node=p["node"], command="ip -6 -d -j route show table main",
                                          exit_code=r.returncode, output=f"missing: {missing[:10]}")]


def check_route_absent(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    p = inv.params
    table = str(p["table"])
    found: list[str] = []
    evidence: list[Evidence] = []
    for fam in (6, 4):
        r = ctx.run(p["node"], ["ip", f"-{fam}", "-j", "route", "show", "table", table], timeout_s=5)
        try:
            dsts = {e.get("dst", "") for e in json.loads(r.stdout or "[]")}
        except ValueError:
            dsts = set()
        found += [x for x in p["prefixes"] if x in dsts]
        evidence.append(_ev(r))
        if p.get("rules_iif"):
            rr = ctx.run(p["node"], ["ip", f"-{fam}", "-j", "rule", "show"], timeout_s=5)
            try:
                rules = json.loads(rr.stdout or "[]")
            except ValueError:
                rules = []
            found += [f"rule iif {p['rules_iif']} lookup {table} (IPv{fam})" for x in rules
                      if x.get("iif") == p["rules_iif"] and str(x.get("table")) == table]
            evidence.append(_ev(rr))
    if p.get("interface") and p.get("addresses"):
        ra = ctx.shared(p["node"], ["ip", "-j", "addr", "show"])
        try:
            links = json.loads(ra.stdout or "[]")
        except ValueError:
            return False, f"{p['node']}: ip -j addr show did not answer JSON", [*evidence, _ev(ra)]
        have = {f"{a.get('local')}/{a.get('prefixlen')}" for ln in links if ln.get("ifname") == p["interface"]
                for a in ln.get("addr_info", [])}
        found += [f"address {x} on {p['interface']}" for x in p["addresses"] if x in have]
        evidence.append(Evidence(node=p["node"], command=f"ip -j addr show # {p['interface']}", exit_code=ra.returncode,
                                 output=f"{p['interface']} has {sorted(have)}"[:EXCERPT]))
    detail = f"{p['node']} table {table}: " + ("nothing left" if not found else f"still has {', '.join(found)}")
    return not found, detail, evidence


def _route_shape(family: int, rtype: str, dst: str, segs: str | None, dev: str | None) -> str:
    """A route as ``TYPE DST -> FORWARDING``, comparable between rendered arguments and the
    kernel's JSON (metrics and counters left out: they do not say where packets go)."""
    if dst == "default":
        dst = "::/0" if family == 6 else "0.0.0.0/0"
    elif "/" not in dst:
        dst += "/128" if family == 6 else "/32"
    fwd = f"seg6 {segs}" if segs else f"dev {dev}" if dev else "-"
    return f"{rtype} {dst} -> {fwd}"


def rendered_route_shape(family: int, args: str) -> str:
    """:func:`_route_shape` of rendered ``ip route`` arguments."""
    w = args.split()
    rtype = w.pop(0) if w[0] in ("unreachable", "blackhole", "prohibit", "throw") else "unicast"
    segs = w[w.index("segs") + 1] if "segs" in w else None
    dev = w[w.index("dev") + 1] if "dev" in w and rtype == "unicast" else None
    return _route_shape(family, rtype, w[0], segs, dev)


def kernel_route_shape(family: int, route: dict[str, Any]) -> str:
    """:func:`_route_shape` of one route of ``ip -d -j route show``."""
    rtype = route.get("type", "unicast")
    segs = route.get("segs")
    if isinstance(segs, list):
        segs = ",".join(segs)
    seg6 = route.get("encap") == "seg6"
    return _route_shape(family, rtype, route.get("dst", ""), segs if seg6 else None,
                        route.get("dev") if rtype == "unicast" and not seg6 else None)


def check_table_routes(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    p = inv.params
    fam, table = int(p["family"]), str(p["table"])
    r = ctx.shared(p["node"], ["ip", f"-{fam}", "-d", "-j", "route", "show", "table", "all"])
    try:
        routes = json.loads(r.stdout or "[]")
    except ValueError:
        return False, f"{p['node']}: ip -{fam} -d -j route show table all did not answer JSON", [_ev(r)]
    have = {kernel_route_shape(fam, e) for e in routes if str(e.get("table")) == table}
    want = {rendered_route_shape(fam, x) for x in p["routes"]}
    missing, extra = sorted(want - have), sorted(have - want)
    cmd = f"ip -{fam} -d -j route show table {table}"
    ev = [Evidence(node=p["node"], command=cmd, exit_code=r.returncode,
                   output=(f"missing: {missing}; unexpected: {extra}" if missing or extra else f"{len(have)} routes as rendered")[:EXCERPT])]
    ctx.diffs[inv.id] = {"missing": missing, "unexpected": extra}
    if missing or extra:
        parts = ([f"lacks {', '.join(missing[:3])}"] if missing else []) + ([f"has unexpected {', '.join(extra[:3])}"] if extra else [])
        return False, f"{p['node']} table {table} (IPv{fam}): " + "; ".join(parts), ev
    return True, f"{p['node']} table {table} (IPv{fam}): {len(have)} routes, as rendered", ev


#: Policy rules the kernel installs in every namespace (ip-rule(8)): priority -> table.
DEFAULT_RULES = {6: {0: "local", 32766: "main"}, 4: {0: "local", 32766: "main", 32767: "default"}}
#: Rule selectors compared (iproute2's JSON keys); any other key but these is compared too, so an
#: unknown selector is never dropped silently.
_RULE_IGNORED = {"priority", "table", "protocol", "src", "srclen", "dst", "dstlen", "fwmark", "fwmask", "action"}
_TABLE_NAMES = {"254": "main", "255": "local", "253": "default"}


def _rule_shape(priority: int, sel: dict[str, str], action: str) -> str:
    return f"{priority}: " + " ".join(f"{k} {v}" for k, v in sorted(sel.items())) + f" -> {action}"


def rendered_rule_shape(family: int, args: str) -> str:
    """A rendered ``ip rule add`` argument string (``priority 1000 iif eth3 lookup 100``) as a
    comparable shape: priority, selectors (a firewall mark as ``*``: which free mark serves a
    floating IP is the operator's choice), action."""
    w = args.split()
    sel: dict[str, str] = {}
    prio, action = -1, "?"
    i = 0
    while i < len(w):
        k = w[i]
        v = w[i + 1] if i + 1 < len(w) else ""
        if k in ("priority", "pref", "preference"):
            prio = int(v)
        elif k in ("lookup", "table"):
            action = f"table {_TABLE_NAMES.get(v, v)}"
        elif k in ("unreachable", "blackhole", "prohibit"):
            action, i = k, i - 1
        elif k == "from":
            if v != "all":
                sel["from"] = str(ipaddress.ip_network(v, strict=False))
        elif k == "to":
            if v != "all":
                sel["to"] = str(ipaddress.ip_network(v, strict=False))
        elif k == "fwmark":
            sel["fwmark"] = "*"
        else:
            sel[k] = v
        i += 2
    return _rule_shape(prio, sel, action)


def kernel_rule_shape(family: int, rule: dict[str, Any]) -> str:
    """:func:`rendered_rule_shape` of one rule of ``ip -j rule show``."""
    sel = {k: str(v) for k, v in rule.items() if k not in _RULE_IGNORED}
    if rule.get("src") not in (None, "all"):
        sel["from"] = str(ipaddress.ip_network(f"{rule['src']}/{rule.get('srclen', 128 if family == 6 else 32)}", strict=False))
    if rule.get("dst") not in (None, "all"):
        sel["to"] = str(ipaddress.ip_network(f"{rule['dst']}/{rule.get('dstlen', 128 if family == 6 else 32)}", strict=False))
    if "fwmark" in rule:
        sel["fwmark"] = "*"
    action = f"table {_TABLE_NAMES.get(str(rule['table']), str(rule['table']))}" if "table" in rule else str(rule.get("action", "?"))
    return _rule_shape(int(rule.get("priority", -1)), sel, action)


def check_policy_rules(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    """The node's policy rules of ``family`` are exactly ``rules`` (rendered ``ip rule add``
    arguments) plus the kernel's defaults (:data:`DEFAULT_RULES`), compared as a multiset of
    shapes (:func:`rendered_rule_shape`): an extra rule (a tenant port sent into another table,
    or into the provider's main table) fails it as a missing one does (issue 36)."""
    from collections import Counter

    p = inv.params
    fam = int(p["family"])
    r = ctx.shared(p["node"], ["ip", f"-{fam}", "-j", "rule", "show"])
    try:
        rules = json.loads(r.stdout or "[]")
    except ValueError:
        return False, f"{p['node']}: ip -{fam} -j rule show did not answer JSON", [_ev(r)]
    have = Counter(kernel_rule_shape(fam, x) for x in rules)
    want = Counter([rendered_rule_shape(fam, x) for x in p["rules"]] +
                   [_rule_shape(pr, {}, f"table {t}") for pr, t in DEFAULT_RULES[fam].items()])
    missing, extra = sorted((want - have).elements()), sorted((have - want).elements())
    ctx.diffs[inv.id] = {"missing": missing, "unexpected": extra}
    ev = [Evidence(node=p["node"], command=f"ip -{fam} -j rule show", exit_code=r.returncode,
                   output=(f"missing: {missing}; unexpected: {extra}" if missing or extra else f"{sum(have.values())} rules")[:EXCERPT])]
    if missing or extra:
        parts = ([f"lacks {'; '.join(missing[:3])}"] if missing else []) + ([f"has unexpected {'; '.join(extra[:3])}"] if extra else [])
        return False, f"{p['node']} IPv{fam} rules: " + "; ".join(parts), ev
    return True, f"{p['node']} IPv{fam} rules: {sum(have.values())}, as rendered", ev


_SID_KEYS = ("action", "table", "vrftable", "nh4", "nh6", "oif", "flavors", "lblen", "nflen")


def _sid_shape(fields: dict[str, str]) -> str:
    return " ".join(f"{k} {fields[k]}" for k in _SID_KEYS if fields.get(k) not in (None, ""))


def _locator_end(dst: str, action: str) -> bool:
    """Whether a seg6local route is a locator's End (``action End`` on a prefix of at most 48
    bits: the underlay's, checked by ``underlay/locator``) rather than a local SID. Any other
    seg6local route of the main table is a local SID, whatever its length: a ``/128`` or ``/80``
    End.DT6 inside the locator wins the longest match as a ``/64`` does (issue 36, attack)."""
    try:
        plen = ipaddress.ip_network(dst if "/" in dst else f"{dst}/128", strict=False).prefixlen
    except ValueError:
        return False
    return action == "End" and plen <= 48


def rendered_sid_shape(args: str) -> str | None:
    """A rendered seg6local route (``SID/64 metric 1024 encap seg6local action End.DT6 table
    100 count dev sr0``) as its behaviour, without the SID (its function is the operator's
    choice); None for a route that is no local SID (no seg6local, or a locator's End:
    :func:`_locator_end`)."""
    w = args.split()
    if not w or "seg6local" not in w:
        return None
    dst = w[0]
    w = w[w.index("seg6local") + 1:]
    fields: dict[str, str] = {}
    i = 0
    while i < len(w):
        if w[i] in _SID_KEYS and i + 1 < len(w):
            fields[w[i]] = w[i + 1]
            i += 2
        else:
            i += 1
    return None if _locator_end(dst, fields.get("action", "")) else _sid_shape(fields)


def kernel_sid_shape(route: dict[str, Any]) -> str | None:
    """:func:`rendered_sid_shape` of one route of ``ip -6 -d -j route show table main`` (a
    ``/128`` destination is printed without its length)."""
    dst = str(route.get("dst", ""))
    if route.get("encap") != "seg6local" or _locator_end(dst, str(route.get("action", ""))):
        return None
    fields = {k: route[k] for k in _SID_KEYS if k in route}
    if isinstance(fields.get("flavors"), list):
        fields["flavors"] = ",".join(fields["flavors"])
    return _sid_shape({k: str(v) for k, v in fields.items()})


def check_local_sids(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    """The node's local SIDs (the seg6local routes of the main table but its locators' End) bind exactly the
    behaviours of ``sids`` (rendered routes), as a multiset of behaviours whatever function
    serves each (:func:`rendered_sid_shape`): a second End.DT6 into a tenant's table (a backdoor
    any SRv6 packet can use) fails it (issue 36). The node's locator End SID (a ``/48``) is the
    underlay's and not counted."""
    from collections import Counter

    p = inv.params
    routes, r = _routes(ctx, p["node"])
    have = Counter(x for e in routes if (x := kernel_sid_shape(e)) is not None)
    want = Counter(x for a in p["sids"] if (x := rendered_sid_shape(a)) is not None)
    missing, extra = sorted((want - have).elements()), sorted((have - want).elements())
    ctx.diffs[inv.id] = {"missing": missing, "unexpected": extra}
    ev = [Evidence(node=p["node"], command="ip -6 -d -j route show table main # seg6local, locator End excluded", exit_code=r.returncode,
                   output=(f"missing: {missing}; unexpected: {extra}" if missing or extra else f"{sum(have.values())} SIDs")[:EXCERPT])]
    if missing or extra:
        parts = ([f"lacks {'; '.join(missing[:3])}"] if missing else []) + ([f"has unexpected {'; '.join(extra[:3])}"] if extra else [])
        return False, f"{p['node']} local SIDs: " + "; ".join(parts), ev
    return True, f"{p['node']} local SIDs: {sum(have.values())} behaviours, as rendered", ev


def check_port_state(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    """Each port of ``ports`` ({port: {mtu, qdisc}}) has that MTU and a root qdisc of that kind
    (``qdisc``: ``noqueue``, the device's default, or a rendered value such as ``tbf rate
    8000000bit``, whose kind is compared: the rate is the ``rate`` check's). A shaper or a
    lowered MTU on a customer's port passes pings (issue 36)."""
    p = inv.params
    rl = ctx.shared(p["node"], ["ip", "-j", "link", "show"])
    rq = ctx.shared(p["node"], ["tc", "-j", "qdisc", "show"])
    try:
        links = {x.get("ifname"): x for x in json.loads(rl.stdout or "[]")}
        roots = {q.get("dev"): q.get("kind") for q in json.loads(rq.stdout or "[]") if q.get("root")}
    except ValueError:
        return False, f"{p['node']}: ip -j link show / tc -j qdisc show did not answer JSON", [_ev(rl), _ev(rq)]
    bad = []
    for port, want in sorted(p["ports"].items()):
        link = links.get(port)
        if link is None:
            bad.append(f"{port} missing")
            continue
        if int(link.get("mtu", 0)) != int(want["mtu"]):
            bad.append(f"{port} mtu {link.get('mtu')} (expected {want['mtu']})")
        kind = str(want["qdisc"]).split()[0]
        if (roots.get(port) or "noqueue") != kind:
            bad.append(f"{port} root qdisc {roots.get(port) or 'noqueue'} (expected {kind})")
    ctx.diffs[inv.id] = {"missing": [], "unexpected": bad}
    ev = [Evidence(node=p["node"], command="ip -j link show; tc -j qdisc show # customer ports", exit_code=rl.returncode or rq.returncode,
                   output=("; ".join(bad) or f"{len(p['ports'])} ports as rendered")[:EXCERPT])]
    if bad:
        return False, f"{p['node']} ports: " + "; ".join(bad[:4]), ev
    return True, f"{p['node']} ports {', '.join(sorted(p['ports']))}: MTU and root qdisc as rendered", ev


def check_address_bound(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    p = inv.params
    r = ctx.shared(p["node"], ["ip", "-j", "addr", "show"])
    try:
        links = json.loads(r.stdout or "[]")
    except ValueError:
        return False, f"{p['node']}: ip -j addr show did not answer JSON", [_ev(r)]
    have = {f"{a.get('local')}/{a.get('prefixlen')}" for ln in links if ln.get("ifname") == p["interface"]
            for a in ln.get("addr_info", [])}
    missing = [x for x in p["addresses"] if x not in have]
    # link-local addresses are the kernel's, never rendered
    ctx.diffs[inv.id] = {"missing": missing, "unexpected": sorted(x for x in have - set(p["addresses"]) if not x.startswith("fe80:"))}
    ev = [Evidence(node=p["node"], command=f"ip -j addr show # {p['interface']}", exit_code=r.returncode,
                   output=f"{p['interface']} has {sorted(have)}"[:EXCERPT])]
    if missing:
        return False, f"{p['node']} {p['interface']} lacks {', '.join(missing)} (has {', '.join(sorted(have)) or 'none'})", ev
    return True, f"{p['node']} {p['interface']} holds {', '.join(p['addresses'])}", ev


def check_isis_adjacency(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    from substrate.frr import ISIS_NEIGHBOR_JSON, parse_isis_neighbors

    p = inv.params
    r = ctx.shared(p["node"], ["vtysh", "-c", ISIS_NEIGHBOR_JSON])
    try:
        adjacencies = parse_isis_neighbors(r.stdout)
    except ValueError:
        return False, f"{p['node']}: IS-IS did not answer {ISIS_NEIGHBOR_JSON!r} with JSON", [_ev(r)]
    # the evidence lists the adjacencies read (the JSON itself is long and hard to read)
    ev = [Evidence(node=r.node, command=ISIS_NEIGHBOR_JSON, exit_code=r.returncode,
                   output="; ".join(f"{a.interface} -> {a.neighbor} L{a.level} {a.state}" for a in adjacencies)[:EXCERPT])]
    for a in adjacencies:
        if a.neighbor == p["neighbor"] and a.interface == p["interface"]:
            return a.state == "Up", f"{p['node']} {a.interface} -> {a.neighbor}: {a.state}", ev
    return False, f"{p['node']} has no IS-IS adjacency to {p['neighbor']} on {p['interface']}", ev


def check_nft_rule(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    p = inv.params
    family, name = p["table"].split()
    r = ctx.shared(p["node"], ["nft", "list", "table", family, name])
    for line in r.stdout.splitlines():
        if all(s in line for s in p["contains"]):
            return True, f"{p['node']} {p['table']}: {line.strip()}", [_ev(r)]
    return False, f"{p['node']} {p['table']} has no rule with {' and '.join(p['contains'])}", [_ev(r)]


def nft_chain_lines(lines: Iterable[str]) -> list[str]:
    """Lines of an nftables chain in comparable form: handles (``# handle N``) and counters
    (``counter [packets N bytes M]``) stripped, then :func:`substrate.journal.normalize_nft_table`
    (whitespace collapsed, hexadecimal numbers canonical); empty lines dropped."""
    from substrate.journal import normalize_nft_table

    out = []
    for ln in lines:
        ln = re.sub(r"#\s*handle \d+", "", ln)
        ln = re.sub(r"\bcounter(?: packets \d+ bytes \d+)?", "", ln)
        ln = normalize_nft_table(ln)
        if ln:
            out.append(ln)
    return out


def nft_chains_of(text: str) -> dict[str, list[str]]:
    """Chain name -> its lines (:func:`nft_chain_lines`), of one ``nft list table`` text ('' = no
    table: no chains)."""
    from substrate.journal import nft_blocks

    return {head.split()[1]: nft_chain_lines(body) for head, body in nft_blocks(text).items()
            if head.startswith("chain ") and len(head.split()) == 2}


def nft_table_below_ani(active: list[Any], node: str, table: str, blocks: dict[str, list[str]]) -> str | None:
    """Who put nftables table ``table`` (``"FAMILY NAME"``) on ``node`` below the ANI on purpose,
    judged by its content (``blocks``: :func:`substrate.journal.nft_blocks`), or None: the
    observer's arrival table (:func:`is_probe_table`) or a fault's of ``active``
    (:func:`substrate.faults.nft_table_owner`; with no active fault, only a cleared latency
    fault's empty table). A table of such a name holding anything else is nobody's: state of the
    device above the ANI."""
    from substrate.faults import nft_table_owner

    if table == f"inet {ARRIVAL_TABLE}" and is_probe_table(blocks):
        return "observer"
    return nft_table_owner(active, node, table, blocks)


def check_nft_tables(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    from substrate.journal import nft_blocks, nft_tables

    p = inv.params
    r = ctx.shared(p["node"], ["nft", "list", "ruleset"])
    if r.returncode != 0:
        return False, f"{p['node']}: nft list ruleset failed: {r.stderr.strip()[:200]}", [_ev(r)]
    # an empty table (no chain, set, map or rule: what a clean-up that flushed it leaves, which a
    # bounded wrapper without ``delete table`` can do no better than) sees no packet: not counted
    blocks = {t: nft_blocks(text) for t, text in nft_tables(r.stdout).items()}
    have = {t for t, b in blocks.items() if any(h or ls for h, ls in b.items()) and nft_table_below_ani([], p["node"], t, b) is None}
    want = set(p["tables"])
    missing, extra = sorted(want - have), sorted(have - want)
    ctx.diffs[inv.id] = {"missing": missing, "unexpected": extra}
    ev = [Evidence(node=p["node"], command="nft list ruleset", exit_code=r.returncode,
                   output=(f"missing: {missing}; unexpected: {extra}" if missing or extra else f"tables {sorted(have)}")[:EXCERPT])]
    if missing or extra:
        parts = ([f"lacks table(s) {', '.join(missing)}"] if missing else []) + \
            ([f"has unexpected table(s) {', '.join(extra)}"] if extra else [])
        return False, f"{p['node']}: " + "; ".join(parts), ev
    return True, f"{p['node']}: nftables tables " + (", ".join(sorted(want)) if want else "none") + ", as rendered", ev


#: nft match expressions whose literal operand names one value (nft(8), PAYLOAD/META
#: EXPRESSIONS): two rules matching the same key with different single values are disjoint.
_NFT_KEYS = ("iifname", "oifname", "iif", "oif", "ip saddr", "ip daddr", "ip6 saddr", "ip6 daddr", "tcp dport", "udp dport",
             "meta mark")
#: A single value, and nothing else: a quoted name without a wildcard, an address without a
#: length, a decimal or hex number (not an operator, a set, a map, a named set, a range).
_NFT_VALUE = re.compile(r'^("[^"*\\]+"|[0-9a-fA-F:.]*[:.][0-9a-fA-F:.]*|\d+|0x[0-9a-fA-F]+)$')
#: Words that start a statement: matches end there (nft(8), STATEMENTS).
_NFT_STATEMENTS = frozenset({"counter", "log", "comment", "limit", "quota", "meta", "ct", "dnat", "snat", "masquerade",
                             "redirect", "accept", "drop", "reject", "queue", "continue", "return", "jump", "goto", "notrack"})
#: A rule holding one of these may rewrite a key or leave evaluation elsewhere: never disjoint.
_NFT_REWRITES = frozenset({"set", "jump", "goto", "vmap", "map"})


def _nft_literals(rule: str) -> dict[str, str] | None:
    """``key: value`` of the single-value matches of an nft rule line, read up to its first
    statement (a match word after a key's value only: ``ct original ip daddr`` is no
    ``ip daddr``); None for a rule that may rewrite a key or jump (:data:`_NFT_REWRITES`), or
    that tests one key twice."""
    w = rule.split()
    if _NFT_REWRITES & set(w):
        return None
    out: dict[str, str] = {}
    i = 0
    while i < len(w):
        key = next((k for k in _NFT_KEYS if w[i:i + len(k.split())] == k.split()), None)
        if key is None:
            if w[i] in _NFT_STATEMENTS:
                break  # statements: no match follows that this reads
            i += 1
            continue
        n = len(key.split())
        v = w[i + n] if i + n < len(w) else ""
        if key in out:
            return None
        if _NFT_VALUE.match(v):
            out[key] = v
        if key.startswith(("ip ", "ip6 ")):  # a payload match implies the family: IPv4 and IPv6 rules never overlap
            out.setdefault("nfproto", key.split()[0])
        i += n + 1
    return out


def _disjoint(a: str, b: str) -> bool:
    """Whether no packet can match both nft rule lines: they test one key for different single
    values (:func:`_nft_literals`; conservative: an unreadable rule overlaps everything)."""
    la, lb = _nft_literals(a), _nft_literals(b)
    if la is None or lb is None:
        return False
    return any(la[k] != lb[k] for k in la.keys() & lb.keys())


def same_behaviour_order(want: list[str], have: list[str]) -> bool:
    """Whether ``have`` (the same lines as ``want``, another order) behaves as ``want``: nft
    evaluates a chain's rules in order, first verdict wins (nft(8)), so only the relative order
    of two rules that one packet can match matters. Every pair whose order differs must be
    disjoint (:func:`_disjoint`; conservative: an unknown match counts as overlapping). An
    agent that appends a floating IP's hairpin rule where the renderer sorts it changed nothing
    (issue 36: the reference operator failed this way on r22)."""
    pos: dict[str, list[int]] = {}
    for i, x in enumerate(have):
        pos.setdefault(x, []).append(i)
    if any(len(v) > 1 for v in pos.values()):
        return False  # duplicated lines: their order cannot be told apart here
    at = {x: v[0] for x, v in pos.items()}
    for i in range(len(want)):
        for j in range(i + 1, len(want)):
            if at[want[i]] > at[want[j]] and not _disjoint(want[i], want[j]):
                return False
    return True


def check_nft_chain(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    p = inv.params
    family, name = p["table"].split()
    r = ctx.shared(p["node"], ["nft", "list", "table", family, name])
    absent = r.returncode != 0 and "No such file or directory" in r.stderr
    if r.returncode != 0 and not absent:
        return False, f"{p['node']}: nft list table {p['table']} failed: {r.stderr.strip()[:200]}", [_ev(r)]
    chains = {} if absent else nft_chains_of(r.stdout)
    ev = [_ev(r)]
    if "chain" not in p:
        want, have = sorted(p["chains"]), sorted(chains)
        missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
        ctx.diffs[inv.id] = {"missing": missing, "unexpected": extra}
        if missing or extra:
            parts = ([f"lacks chain(s) {', '.join(missing)}"] if missing else []) + \
                ([f"has unexpected chain(s) {', '.join(extra)}"] if extra else [])
            return False, f"{p['node']} {p['table']}: " + "; ".join(parts), ev
        return True, f"{p['node']} {p['table']}: " + (f"chains {', '.join(want)}, as rendered" if want else "absent, as rendered"), ev
    want = nft_chain_lines(p["rules"])
    have = chains.get(p["chain"])
    where = f"{p['node']} {p['table']} chain {p['chain']}"
    if have is None:
        ctx.diffs[inv.id] = {"missing": want, "unexpected": []}
        return (not want), f"{where}: " + ("absent" + (f" (expected {len(want)} lines)" if want else ", as rendered")), ev
    from collections import Counter

    if have == want or (p.get("ordered") is False and Counter(have) == Counter(want)):
        ctx.diffs[inv.id] = {"missing": [], "unexpected": []}
        return True, f"{where}: {len(want)} lines, as rendered", ev
    if Counter(have) == Counter(want) and same_behaviour_order(want, have):
        ctx.diffs[inv.id] = {"missing": [], "unexpected": []}
        return True, f"{where}: {len(want)} lines, as rendered (in another order, only between rules no packet matches both of)", ev

    missing = list((Counter(want) - Counter(have)).elements())
    extra = list((Counter(have) - Counter(want)).elements())
    ctx.diffs[inv.id] = {"missing": missing, "unexpected": extra}
    if not missing and not extra:  # nft(8): rules are evaluated in order, first match wins
        at = next(i for i, (a, b) in enumerate(zip(want, have, strict=True)) if a != b)
        return False, f"{where}: the rendered lines in another order (line {at + 1}: {have[at]})", ev
    parts = ([f"lacks {'; '.join(missing[:3])}"] if missing else []) + ([f"has unexpected {'; '.join(extra[:3])}"] if extra else [])
    return False, f"{where}: " + "; ".join(parts), ev


CHECKS: dict[str, Callable[[ObserveContext, Invariant], tuple[bool, str, list[Evidence]]]] = {
    "reach": check_reach,
    "isolated": check_isolated,
    "steered_path": check_steered_path,
    "tcp_verdict": check_tcp_verdict,
    "sid_bound": check_sid_bound,
    "sid_unbound": check_sid_unbound,
    "fib_has": check_fib_has,
    "isis_adjacency": check_isis_adjacency,
    "nft_rule": check_nft_rule,
    "route_absent": check_route_absent,
    "address_bound": check_address_bound,
    "table_routes": check_table_routes,
    "nft_chain": check_nft_chain,
    "nft_tables": check_nft_tables,
    "reach_at": check_reach_at,
    "policy_rules": check_policy_rules,
    "local_sids": check_local_sids,
    "port_state": check_port_state,
}


def class_checks() -> dict[str, Callable[[ObserveContext, Invariant], tuple[bool, str, list[Evidence]]]]:
    """Check kinds the registered service classes add (``ServiceClass.checks``), by kind."""
    from substrate.scenario.layers.base import registry

    return {k: fn for c in registry() for k, fn in c.checks.items()}


def _device_checks() -> dict[str, Callable[[ObserveContext, Invariant], tuple[bool, str, list[Evidence]]]]:
    """The generic device-output kinds (``output_check``, ``json_value``:
    :mod:`substrate.scenario.device_checks`), which the protocol templates' test cases use."""
    from substrate.scenario.device_checks import CHECKS as DEVICE_CHECKS

    return DEVICE_CHECKS


def check_one(ctx: ObserveContext, inv: Invariant) -> Verdict:
    """Check one invariant; any failure to check is a failed verdict with the reason."""
    t0 = time.monotonic()
    fn = CHECKS.get(inv.kind) or class_checks().get(inv.kind) or _device_checks().get(inv.kind)
    if fn is None:
        return Verdict(id=inv.id, kind=inv.kind, service=inv.service, ok=False, detail=f"unknown check kind {inv.kind!r}")
    bad = ctx.unflushed.get(str(inv.params.get("src")))
    if bad is not None:
        return Verdict(id=inv.id, kind=inv.kind, service=inv.service, ok=False, evidence=[_ev(bad, FLUSH_NEIGHBOURS)],
                       detail=f"check could not run: the neighbour cache of {bad.node} could not be flushed")
    try:
        ok, detail, ev = fn(ctx, inv)
    except Exception as e:  # noqa: BLE001 - a check that cannot run is a failed check, with evidence
        ok, detail, ev = False, f"check could not run: {type(e).__name__}: {e}", []
    return Verdict(id=inv.id, kind=inv.kind, service=inv.service, ok=ok, detail=detail, evidence=ev,
                   duration_s=time.monotonic() - t0, diff=ctx.diffs.get(inv.id))


def probe_kinds() -> frozenset[str]:
    """Every check kind that probes from a host: the built-in ones and the service classes'."""
    from substrate.scenario.layers.base import registry

    return PROBE_KINDS | {k for c in registry() for k in c.probe_kinds}


def flush_neighbours(ctx: ObserveContext, pool: ThreadPoolExecutor) -> None:
    """Flush the neighbour caches of every host node of the lab (both families, every state), in
    parallel; hosts where it fails go to ``ctx.unflushed``."""
    from substrate.topology import Role

    hosts = [n.name for n in ctx.lab.topology.nodes if n.role is Role.HOST]

    def one(h: str) -> None:
        try:
            r = ctx.run(h, ["sh", "-c", FLUSH_NEIGHBOURS], timeout_s=5)
        except Exception as e:  # noqa: BLE001 - a host that cannot be reached fails its probes, with the reason
            from substrate.process import ExecResult

            r = ExecResult(node=h, argv=["sh", "-c", FLUSH_NEIGHBOURS], returncode=-1, stdout="", stderr=str(e), duration_s=0.0)
        if r.returncode != 0:
            ctx.unflushed[h] = r

    list(pool.map(one, hosts))


def observe(lab: Lab, invariants: Iterable[Invariant], *, workers: int = WORKERS, flush: bool = True) -> list[Verdict]:
    """Check ``invariants`` in parallel; verdicts in input order. When any of them probes from a
    host (:func:`probe_kinds`), every host's neighbour cache is flushed first (module docstring;
    ``flush=False`` skips it: for measuring its cost only, never for a verdict)."""
    invs = list(invariants)
    ctx = ObserveContext(lab)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(invs) or 1)), thread_name_prefix="observe") as pool:
        kinds = probe_kinds()
        if flush and any(i.kind in kinds for i in invs):
            flush_neighbours(ctx, pool)
        try:
            return list(pool.map(lambda i: check_one(ctx, i), invs))
        finally:
            ctx.close(pool)
