"""Service class ``rate_limits``: per-tenant rate limits on attachment circuits.

A rate limit holds the traffic a PE sends down one site's attachment circuit to a rate: a
token-bucket shaper (``tc qdisc ... root handle 1: tbf rate R burst 32kb latency 50ms``,
tc-tbf(8)) as the root queueing discipline of the PE port toward the site's CE. The kernel here
has TBF and HTB but no police action, so limits shape the PE's egress (the customer's download
direction), as a provider's per-circuit shaper does.

Invariants (service ``rate_limit/<id>``), measured with a bounded probe -- a TCP bulk transfer of
about 1.5 s at the limit, timed from the sender until the receiver has everything
(:func:`check_rate`):

- another site of the tenant sends to the limited site: the achieved rate lies within
  ``[0.4, 1.25] x`` the limit (held, and not broken: a tolerance for a loaded machine below,
  the token bucket's burst above);
- when another tenant has a site on the same PE, a transfer to it is not held to the limit
  (at least twice the limit): the shaper is per circuit, not per PE;
- the PE port's root queueing discipline is the token bucket at exactly the limit (``shaper``,
  read with ``tc -j qdisc``): the probe's tolerance lets a limit changed to half of its rate
  pass, the device state does not.
"""

from __future__ import annotations

import random
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from pydantic import Field

from substrate.scenario.apply import qdisc_value
from substrate.scenario.layers.base import GenerationError, Layer, LayerParams, RecordIntent, node_cfg, register
from substrate.scenario.layers.l3vpn import ce_addr, dump, site_changed
from substrate.scenario.layers.specs import InstanceId, Spec
from substrate.scenario.model import Invariant, NodeConfig, RateLimit, Scenario, Site

if TYPE_CHECKING:
    from substrate.scenario.observer import Evidence, ObserveContext

#: Rates the generator draws (Mbit/s).
RATES = (5, 10, 20)
#: Seconds a probe transfer lasts at the limit.
PROBE_S = 1.5
#: Bounds of the achieved rate, as multiples of the limit: held, and not broken; another tenant's circuit.
HELD = (0.4, 1.25)
UNAFFECTED = 2.0
#: TCP ports of the probes (one per invariant: probes of one observation pass run in parallel).
PORT_BASE = 5201


class RateLimitsParams(LayerParams):
    """Rate limits per unit of density, and the rates drawn (Mbit/s)."""

    per_density: int = Field(default=1, ge=0, le=100)
    rates: list[int] = Field(default_factory=lambda: list(RATES), min_length=1)


def probe_bytes(rate_mbit: int) -> int:
    """Bytes of a probe transfer: :data:`PROBE_S` seconds at ``rate_mbit``."""
    return int(rate_mbit * 1_000_000 / 8 * PROBE_S)


def source_of(sc: Scenario, site: Site) -> Site | None:
    """The site a limit's probe sends from: the tenant's first other site."""
    return next((s for s in sc.tenant(site.tenant).sites if s.id != site.id), None)


def neighbour_of(sc: Scenario, site: Site) -> tuple[Site, Site] | None:
    """(source, destination) of the unaffected-tenant probe: the first site of another tenant on
    the same PE that has another site to send from, and that one."""
    for t in sc.tenants:
        if t.id == site.tenant:
            continue
        for s in t.sites:
            if s.pe == site.pe:
                src = next((o for o in t.sites if o.id != s.id), None)
                if src is not None:
                    return src, s
    return None


def render_limits(sc: Scenario, out: dict[str, NodeConfig]) -> None:
    """The shaper of every limit, on its site's PE port."""
    sites = {s.id: s for s in sc.all_sites()}
    for x in sc.rate_limits:
        s = sites[x.site]
        node_cfg(out, s.pe).qdiscs[s.pe_if] = qdisc_value("tbf", x.rate_mbit * 1_000_000)


# -- the probe (observer check kind ``rate``) -----------------------------------------------------------


#: TCP MSS of the probe's sender: its segments fit a 1500-byte core link after the 40-byte outer
#: IPv6 header of H.Encaps.Red (links here are 1500 bytes everywhere, and the ICMPv6 Packet Too
#: Big for a packet too large after encapsulation goes to the encapsulating PE, not to the CE:
#: a full-size TCP transfer between sites on different PEs stalls).
PROBE_MSS = 1200
#: The sender (run with the node's system Python): connect, send, half-close, wait until the
#: receiver has read everything and closed; print the nanoseconds from connect to that close.
_SENDER = f"""
import socket, sys, time
dst, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, {PROBE_MSS})
s.settimeout(15)
s.connect((dst, port))
t0 = time.monotonic()
buf = bytes(65536)
while n > 0:
    n -= s.send(buf[:min(n, len(buf))])
s.shutdown(socket.SHUT_WR)
while s.recv(65536):
    pass
print(f"ok ns={{int((time.monotonic() - t0) * 1e9)}}")
"""


def check_rate(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    """``rate`` {src, dst_node, dst, port, bytes, min_mbit, max_mbit}: a TCP transfer of ``bytes``
    from host ``src`` to ``dst`` (host ``dst_node`` receives on ``port``) achieves a rate within
    [min_mbit, max_mbit] (either may be None). Timed in ``src`` from the first byte sent until
    the receiver closed, having read everything. Tried twice (a loaded machine can slow a
    transfer down, never speed it past a shaper)."""
    from substrate.scenario.observer import _ev

    p = inv.params
    lo, hi = p.get("min_mbit"), p.get("max_mbit")
    evidence: list[Evidence] = []
    detail = ""
    for _attempt in range(2):
        got: dict[str, Any] = {}
        recv = threading.Thread(target=lambda: got.update(r=ctx.run(
            p["dst_node"], ["sh", "-c", f"timeout 20 nc -6 -l {p['port']} > /dev/null"], timeout_s=25)))
        recv.start()
        listening = False
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and recv.is_alive():
            r = ctx.run(p["dst_node"], ["ss", "-6", "-ltnH", f"sport = :{p['port']}"], timeout_s=5)
            if r.stdout.strip():
                listening = True
                break
            time.sleep(0.05)
        if not listening:
            recv.join(timeout=25)
            evidence = [_ev(got["r"])] if "r" in got else []
            detail = f"{p['dst_node']} could not listen on TCP {p['port']}"
            continue
        sent = ctx.run(p["src"], ["timeout", "20", "/usr/bin/python3", "-c", _SENDER, p["dst"], str(p["port"]), str(p["bytes"])],
                       timeout_s=25)
        recv.join(timeout=25)
        evidence = [_ev(sent, f"{p['src']}: send {p['bytes']} bytes to [{p['dst']}]:{p['port']} (TCP, MSS {PROBE_MSS})")]
        m = re.search(r"ok ns=(\d+)", sent.stdout)
        if not m:
            detail = f"the transfer from {p['src']} to {p['dst']} failed: {(sent.stderr or sent.stdout).strip()[-200:]}"
            continue
        secs = int(m.group(1)) / 1e9
        mbit = p["bytes"] * 8 / secs / 1e6
        detail = f"{p['bytes']} bytes in {secs:.2f} s: {mbit:.1f} Mbit/s " + (
            f"(expected {lo if lo is not None else 0:g}..{hi if hi is not None else 'any':} Mbit/s)")
        if (lo is None or mbit >= lo) and (hi is None or mbit <= hi):
            return True, detail, evidence
        if hi is not None and mbit > hi:
            break  # too fast: the shaper is not there; a retry cannot change that
    return False, detail, evidence


def check_shaper(ctx: ObserveContext, inv: Invariant) -> tuple[bool, str, list[Evidence]]:
    """``shaper`` {node, dev, qdisc}: the root queueing discipline of ``dev`` on ``node`` is
    ``qdisc`` in :func:`substrate.scenario.apply.qdisc_value` form (``tbf rate <bit/s>bit``;
    ``tc -j`` gives the rate in bytes per second)."""
    import json

    from substrate.scenario.observer import _ev

    p = inv.params
    r = ctx.run(p["node"], ["tc", "-j", "qdisc", "show", "dev", p["dev"], "root"], timeout_s=10)
    if not r.ok:
        return False, f"{p['node']}: cannot read the qdisc of {p['dev']}", [_ev(r)]
    try:
        roots = [q for q in json.loads(r.stdout or "[]") if q.get("root")]
    except ValueError:
        return False, f"{p['node']}: unreadable tc output for {p['dev']}", [_ev(r)]
    q = roots[0] if roots else {}
    rate = q.get("options", {}).get("rate")
    have = qdisc_value(q.get("kind", "none"), int(rate) * 8 if q.get("kind") == "tbf" and rate is not None else None)
    ok = have == p["qdisc"]
    return ok, f"{p['node']} {p['dev']}: root qdisc {have}" + ("" if ok else f" (expected {p['qdisc']})"), [_ev(r)]


# -- typed specs (the A3-T catalog) ---------------------------------------------------------------------


class RateLimitSpec(Spec):
    """A shaper on a site's attachment circuit: the PE sends the site at most rate_mbit (token bucket, tc-tbf)."""

    site: InstanceId = Field(description="Site whose circuit is limited, e.g. 't3s2'.")
    rate_mbit: int = Field(ge=1, le=1000, description="Rate in Mbit/s.")


class RateLimitPatch(Spec):
    """Fields of a rate limit to change."""

    site: InstanceId | None = None
    rate_mbit: int | None = Field(default=None, ge=1, le=1000, description="Rate in Mbit/s.")


class RateLimitIntent(RecordIntent):
    """Catalog class ``rate_limit``."""

    name = "rate_limit"
    field = "rate_limits"
    id_prefix = "rl"
    Record = RateLimit
    Spec = RateLimitSpec
    Patch = RateLimitPatch
    id_type = InstanceId
    id_doc = "New rate limit id (e.g. 'rl3'); left out = next free 'rl<N>'."
    info = {
        "description": "A per-tenant rate limit on one site's attachment circuit: a token-bucket shaper (tc tbf, burst "
                       "32kb, latency 50ms) as the root qdisc of the PE port toward the site's CE, so that the PE sends "
                       "the site at most rate_mbit. Checked with a timed bulk transfer from another site of the tenant; "
                       "the site's tenant needs a second site. One limit per site.",
        "id_format": "rl<N>, e.g. 'rl2'",
        "allocated": [],
        "layer": "rate_limits",
    }  # fmt: skip
    examples = [{"op": "create", "service_class": "rate_limit", "id": "rl2", "spec": {"site": "t3s2", "rate_mbit": 10}},
                {"op": "modify", "service_class": "rate_limit", "id": "rl2", "spec": {"rate_mbit": 20}}]  # fmt: skip

    def spec_of(self, x: Any) -> dict[str, Any]:
        return {"site": x.site, "rate_mbit": x.rate_mbit}

    def allocated(self, sc: Scenario, x: Any) -> dict[str, Any]:
        s = sc.site(x.site)
        return {"pe": s.pe, "pe_interface": s.pe_if, "qdisc": qdisc_value("tbf", x.rate_mbit * 1_000_000)}

    def service(self, x: Any) -> str:
        return f"rate_limit/{x.id}"


@register
class RateLimits(Layer):
    """Per-tenant rate limits (see module docstring)."""

    name = "rate_limits"
    requires = ("l3vpn",)
    Params = RateLimitsParams
    records = ("rate_limits",)
    intents = (RateLimitIntent(),)
    checks = {"rate": check_rate, "shaper": check_shaper}
    probe_kinds = frozenset({"rate"})

    def generate(self, sc: Scenario, params: LayerParams, rng: random.Random, density: int) -> Scenario:
        assert isinstance(params, RateLimitsParams)
        if any(not 1 <= r <= 1000 for r in params.rates):
            raise GenerationError("layers.rate_limits.rates", f"rates are 1..1000 Mbit/s, got {params.rates}")
        limits = list(sc.rate_limits)
        taken = {x.site for x in limits}
        cands = [s for t in sc.tenants if len(t.sites) >= 2 for s in t.sites if s.id not in taken]
        for s in rng.sample(cands, min(params.per_density * density, len(cands))):
            limits.append(RateLimit(id=f"rl{len(limits) + 1}", site=s.id, rate_mbit=rng.choice(params.rates)))
        return sc.model_copy(update={"rate_limits": limits})

    def render(self, sc: Scenario, out: dict[str, NodeConfig]) -> None:
        render_limits(sc, out)

    def invariants(self, sc: Scenario) -> list[Invariant]:
        out: list[Invariant] = []
        for k, x in enumerate(sc.rate_limits):
            s = sc.site(x.site)
            out.append(Invariant(
                id=f"rate_limit/{x.id}/shaper", kind="shaper", service=f"rate_limit/{x.id}",
                params={"node": s.pe, "dev": s.pe_if, "qdisc": qdisc_value("tbf", x.rate_mbit * 1_000_000)},
                description=f"{s.pe} shapes its port {s.pe_if} toward site {s.id} to {x.rate_mbit} Mbit/s ({x.id})",
            ))  # fmt: skip
            src = source_of(sc, s)
            if src is None:
                continue
            n = probe_bytes(x.rate_mbit)
            out.append(Invariant(
                id=f"rate_limit/{x.id}/held/{src.id}->{s.id}", kind="rate", service=f"rate_limit/{x.id}",
                params={"src": src.ce, "dst_node": s.ce, "dst": ce_addr(s.prefix6, 2), "port": PORT_BASE + 2 * k, "bytes": n,
                        "min_mbit": round(HELD[0] * x.rate_mbit, 3), "max_mbit": round(HELD[1] * x.rate_mbit, 3)},
                description=f"traffic from site {src.id} to site {s.id} is held to its {x.rate_mbit} Mbit/s limit ({x.id})",
            ))  # fmt: skip
            nb = neighbour_of(sc, s)
            if nb is not None:
                osrc, odst = nb
                out.append(Invariant(
                    id=f"rate_limit/{x.id}/unaffected/{osrc.id}->{odst.id}", kind="rate", service=f"rate_limit/{x.id}",
                    params={"src": osrc.ce, "dst_node": odst.ce, "dst": ce_addr(odst.prefix6, 2), "port": PORT_BASE + 2 * k + 1,
                            "bytes": n, "min_mbit": UNAFFECTED * x.rate_mbit, "max_mbit": None},
                    description=f"{odst.tenant}'s site {odst.id} on the same PE ({s.pe}) is not held to {x.id}'s limit",
                ))  # fmt: skip
        return out

    # -- planner hooks -------------------------------------------------------------------------------

    def integrity(self, ctx: Any) -> None:
        """Limit rules: the site exists; one limit per site; the tenant has another site to probe from."""
        sites = ctx.sites()
        per_site: dict[str, str] = {}
        for x in ctx.work.rate_limits:
            s = sites.get(x.site)
            if s is None:
                ctx.final([(x.id, "spec.site"), (x.site, "id")], f"rate_limit {x.id} shapes site {x.site}, which would not exist; "
                                                                  f"delete or change {x.id} in the same change set")  # fmt: skip
                continue
            if x.site in per_site:
                ctx.final([(x.id, "spec.site")], f"site {x.site} already has rate limit {per_site[x.site]} (one per site)")
            per_site[x.site] = x.id
            if x.id in ctx.touch and source_of(ctx.work, s) is None:
                ctx.final([(x.id, "spec.site")], f"rate_limit {x.id}: tenant {s.tenant} has no other site to check the limit from")

    # -- validation scope ----------------------------------------------------------------------------

    def service_nodes(self, sc: Scenario, out: dict[str, set[str]]) -> None:
        sites = {s.id: s for s in sc.all_sites()}
        for x in sc.rate_limits:
            s = sites.get(x.site)
            if s is None:
                continue
            nodes = {s.pe, s.ce}
            src = source_of(sc, s)
            if src is not None:
                nodes |= {src.pe, src.ce}
            out[f"rate_limit/{x.id}"] = nodes

    def changed(self, old: Scenario, new: Scenario) -> set[str]:
        ol, nl = {x.id: x for x in old.rate_limits}, {x.id: x for x in new.rate_limits}
        return {f"rate_limit/{k}" for k in set(ol) | set(nl)
                if dump(ol.get(k)) != dump(nl.get(k)) or site_changed(old, new, (nl.get(k) or ol[k]).site)}  # fmt: skip

    # -- references between instances ----------------------------------------------------------------

    def references(self, sc: Scenario, cls: str, iid: str) -> list[str]:
        if cls == "tenant_site":
            return [f"{x.id} (rate limit)" for x in sc.rate_limits if x.site == iid]
        return []

    def drop_dependents(self, sc: Scenario, cls: str, iid: str) -> None:
        if cls == "tenant_site":
            sc.rate_limits = [x for x in sc.rate_limits if x.site != iid]
        elif cls == "rate_limit":
            sc.rate_limits = [x for x in sc.rate_limits if x.id != iid]

    def pins_site(self, sc: Scenario, site: str) -> bool:
        """A limited site, and the site its probe sends from."""
        for x in sc.rate_limits:
            if x.site == site:
                return True
            try:
                src = source_of(sc, sc.site(x.site))
            except KeyError:
                continue
            if src is not None and src.id == site:
                return True
        return False

