"""Applying rendered service state (:class:`NodeConfig`) to a node, and diffs between renderings.

Deploy applies a whole rendering; A3-T applies the difference between the rendering before and
after an intent (:func:`config_delta`), so that an intent changes exactly the device state it
implies and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from substrate.errors import ExecError
from substrate.routes import route_key
from substrate.scenario.model import NodeConfig

if TYPE_CHECKING:
    from substrate.lab import Lab
    from substrate.process import ExecResult


def _heredoc(cmd: str, lines: list[str], tag: str, *, tolerant: bool = False) -> str:
    """``cmd`` reading ``lines`` from a here-document; ``tolerant`` ignores its exit status."""
    body = "\n".join(lines)
    return f"{cmd} <<'{tag}'{' || true' if tolerant else ''}\n{body}\n{tag}\n"


def nft_replace(table: str, text: str) -> str:
    """An nft script that replaces ``table`` (e.g. ``inet tenant_fw``) atomically by ``text``
    (``add`` + ``delete`` make it work whether or not the table exists)."""
    return f"add table {table}\ndelete table {table}\n{text}"


def nft_delete(table: str) -> str:
    """An nft script that removes ``table`` if present."""
    return f"add table {table}\ndelete table {table}\n"


#: Burst and latency of the token-bucket shapers services render (their rate is the service's):
#: a burst of 32 KiB is above rate/HZ up to 1 Gbit/s at HZ=250 (tc-tbf(8)). The root gets handle
#: 1: (a kernel-chosen handle would differ after each re-creation, and so would the device state).
TBF_OPTIONS = "burst 32kb latency 50ms"


def qdisc_value(kind: str, rate_bit: int | None = None) -> str:
    """The canonical value of a root queueing discipline: ``tbf rate <bit/s>bit`` for a token
    bucket (what a rate limit is), the bare kind for anything else."""
    return f"tbf rate {rate_bit}bit" if kind == "tbf" and rate_bit is not None else kind


def qdisc_command(dev: str, value: str | None) -> str:
    """The tc command giving ``dev`` the root qdisc ``value`` (None: the device's default)."""
    if value is None:
        return f"tc qdisc del dev {dev} root 2>/dev/null || true"
    return f"tc qdisc replace dev {dev} root handle 1: {value}" + (f" {TBF_OPTIONS}" if value.startswith("tbf ") else "")


#: The queueing disciplines a device's ingress side can have (tc-bpf(8): ``clsact`` holds ingress and
#: egress filter hooks; ``ingress`` the ingress one); they share handle ``ffff:``, so a device has one.
INGRESS_KINDS = ("clsact", "ingress")


def ingress_command(dev: str, kind: str | None) -> str:
    """The tc commands giving ``dev`` the ingress-side qdisc ``kind`` (one of :data:`INGRESS_KINDS`;
    None: none). The one there is deleted first, by its own kind (tc refuses ``del ... ingress``
    on a clsact and the other way round), with the filters attached to it."""
    if kind is not None and kind not in INGRESS_KINDS:
        raise ValueError(f"not an ingress-side qdisc: {kind!r}")
    drop = " || ".join(f"tc qdisc del dev {dev} {k} 2>/dev/null" for k in INGRESS_KINDS) + " || true"
    return drop if kind is None else f"{{ {drop}; }} && tc qdisc add dev {dev} {kind}"


def config_script(cfg: NodeConfig) -> str:
    """One bash script that applies ``cfg`` to a node (order: sysctls, links and addresses,
    nftables, IPv6 rules and routes, IPv4 rules and routes, FRR). Stops at the first error."""
    parts = ["set -e"]
    for k, v in sorted(cfg.sysctls.items()):
        parts.append(f"echo {v} > /proc/sys/{k}")
    link_lines = [f"link set {i} up" for i in cfg.links_up] + [f"addr add {a}" for a in cfg.addresses]
    if link_lines:
        parts.append(_heredoc("ip -batch -", link_lines, "ANIBENCH_LINKS"))
    for table, text in sorted(cfg.nft.items()):
        parts.append(_heredoc("nft -f -", nft_replace(table, text).splitlines(), "ANIBENCH_NFT"))
    for fam in (6, 4):
        lines = [f"rule add {r}" for r in getattr(cfg, f"rules{fam}")] + [f"route add {r}" for r in getattr(cfg, f"routes{fam}")]
        if lines:
            parts.append(_heredoc(f"ip -{fam} -batch -", lines, f"ANIBENCH_IP{fam}"))
    if cfg.frr:
        conf = ["configure terminal"] + [ln for block in cfg.frr for ln in block.splitlines()] + ["end"]
        parts.append(_heredoc("vtysh", conf, "ANIBENCH_FRR"))
    parts += [qdisc_command(dev, v) for dev, v in sorted(cfg.qdiscs.items())]
    return "\n".join(parts) + "\n"


def apply_config(lab: Lab, node: str, cfg: NodeConfig, timeout_s: float = 90.0) -> ExecResult:
    """Apply a whole NodeConfig to ``node`` (one command in the node). ``timeout_s`` bounds a
    hang, not the work: on a loaded 2-core machine a PE's SRv6 routes and helpers on the eBPF
    data plane took up to 30 s (issue 34; all 44 nodes of the brownfield apply at once).

    Raises:
        ExecError: a line was refused (the message quotes iproute2/nft's error).
    """
    r = lab.sh(node, config_script(cfg), timeout_s=timeout_s)
    if not r.ok:
        why = f"timed out after {timeout_s:g} s" if r.timed_out else (r.stderr or r.stdout).strip()[:600]
        raise ExecError(f"{node}: applying service state failed: {why}")
    return r


@dataclass
class ConfigDelta:
    """What changes on one node between two renderings, as commands (removals first)."""

    node: str
    removals: list[str] = field(default_factory=list)
    additions: list[str] = field(default_factory=list)
    nft: dict[str, str | None] = field(default_factory=dict)  # table -> new text, None = delete
    sysctls: dict[str, str] = field(default_factory=dict)
    frr: list[str] = field(default_factory=list)  # vtysh configuration lines (see frr_delta)
    #: the same FRR change as data: (stanza head or "" for a top-level line, line, present after)
    frr_changes: list[tuple[str, str, bool]] = field(default_factory=list)
    qdiscs: dict[str, str | None] = field(default_factory=dict)  # device -> root qdisc value, None = default
    #: device -> its ingress-side qdisc (:data:`INGRESS_KINDS`), None = none (a reconciler's repair; no service renders one)
    ingress: dict[str, str | None] = field(default_factory=dict)

    def empty(self) -> bool:
        return not (self.removals or self.additions or self.nft or self.sysctls or self.frr or self.qdiscs or self.ingress)

    def describe(self) -> list[str]:
        """Human-readable lines (``- ...`` removed, ``+ ...`` added), for plans and reports."""
        out = [f"- {x}" for x in self.removals] + [f"+ {x}" for x in self.additions]
        out += [f"~ nft table {t}: {'delete' if v is None else 'replace'}" for t, v in sorted(self.nft.items())]
        out += [f"~ sysctl {k}={v}" for k, v in sorted(self.sysctls.items())]
        out += [f"~ frr: {x}" for x in self.frr]
        out += [f"~ qdisc {d}: {v or 'default'}" for d, v in sorted(self.qdiscs.items())]
        out += [f"~ qdisc {d} ingress side: {v or 'none'}" for d, v in sorted(self.ingress.items())]
        return out

    def script(self) -> str:
        """A bash script applying the delta (removals tolerate already-absent objects). Lines
        without a family flag (``link``, ``addr``, ``nexthop``: a nexthop group has no family, and
        ``ip -4|-6 nexthop add ... group`` is refused) run in ``ip -batch`` before the others."""
        parts = ["set -e"]
        for k, v in sorted(self.sysctls.items()):
            parts.append(f"echo {v} > /proc/sys/{k}")
        for fam_flag, lines, tag, strict in (
            ("", [x for x in self.removals if x.startswith(_UNFAMILIED)], "ANIBENCH_RL", False),
            ("-6 ", [x[3:] for x in self.removals if x.startswith("-6 ")], "ANIBENCH_R6", False),
            ("-4 ", [x[3:] for x in self.removals if x.startswith("-4 ")], "ANIBENCH_R4", False),
            ("", [x for x in self.additions if x.startswith(_UNFAMILIED)], "ANIBENCH_AL", True),
        ):
            if lines:
                cmd = f"ip {fam_flag}-batch -" if strict else f"ip {fam_flag}-force -batch -"
                parts.append(_heredoc(cmd, lines, tag, tolerant=not strict))
        for table, text in sorted(self.nft.items()):
            script = nft_delete(table) if text is None else nft_replace(table, text)
            parts.append(_heredoc("nft -f -", script.splitlines(), "ANIBENCH_NFT"))
        if self.frr:
            # FRR first: interface addresses must exist before routes and rules that use them
            parts.append(_heredoc("vtysh", ["configure terminal", *self.frr, "end"], "ANIBENCH_FRR"))
        for fam in (6, 4):
            lines = [x[3:] for x in self.additions if x.startswith(f"-{fam} ")]
            if lines:
                parts.append(_heredoc(f"ip -{fam} -batch -", lines, f"ANIBENCH_A{fam}"))
        parts += [qdisc_command(dev, v) for dev, v in sorted(self.qdiscs.items())]
        parts += [ingress_command(dev, v) for dev, v in sorted(self.ingress.items())]
        return "\n".join(parts) + "\n"


#: ``ip`` objects a delta's lines carry no family flag for (see :meth:`ConfigDelta.script`).
_UNFAMILIED = ("link ", "addr ", "nexthop ")


def config_delta(node: str, before: NodeConfig | None, after: NodeConfig | None) -> ConfigDelta:
    """Commands that turn ``before``'s service state into ``after``'s on ``node``."""
    b, a = before or NodeConfig(), after or NodeConfig()
    d = ConfigDelta(node=node)
    for fam in (6, 4):
        old_r, new_r = getattr(b, f"routes{fam}"), getattr(a, f"routes{fam}")
        new_keys = {route_key(r) for r in new_r}
        # a route whose key survives is replaced in place (route replace), not deleted first
        d.removals += [f"-{fam} route del {route_key(r)}" for r in old_r if r not in new_r and route_key(r) not in new_keys]
        d.additions += [f"-{fam} route replace {r}" for r in new_r if r not in old_r]
        old_ru, new_ru = getattr(b, f"rules{fam}"), getattr(a, f"rules{fam}")
        d.removals += [f"-{fam} rule del {r}" for r in old_ru if r not in new_ru]
        d.additions += [f"-{fam} rule add {r}" for r in new_ru if r not in old_ru]
    d.removals += [f"addr del {x}" for x in b.addresses if x not in a.addresses]
    d.additions += [f"addr replace {x}" for x in a.addresses if x not in b.addresses]
    d.additions += [f"link set {i} up" for i in a.links_up if i not in b.links_up]
    for table in sorted(set(b.nft) | set(a.nft)):
        if b.nft.get(table) != a.nft.get(table):
            d.nft[table] = a.nft.get(table)
    d.sysctls = {k: v for k, v in a.sysctls.items() if b.sysctls.get(k) != v}
    d.qdiscs = {dev: a.qdiscs.get(dev) for dev in sorted(set(b.qdiscs) | set(a.qdiscs)) if b.qdiscs.get(dev) != a.qdiscs.get(dev)}
    d.frr = frr_delta(b.frr, a.frr)
    d.frr_changes = frr_changes(b.frr, a.frr)
    return d


def _stanzas(blocks: list[str]) -> dict[str, list[str]]:
    """FRR blocks as {context line: [sub-lines]} (a block is a context line and indented lines)."""
    out: dict[str, list[str]] = {}
    for block in blocks:
        lines = [ln.rstrip() for ln in block.splitlines() if ln.strip()]
        if not lines:
            continue
        head, body = lines[0].strip(), [ln.strip() for ln in lines[1:]]
        if not lines[0].startswith(" ") and body:
            out.setdefault(head, [])
            out[head] += [x for x in body if x not in out[head]]
        else:
            out.setdefault("", [])
            out[""] += [x.strip() for x in lines if x.strip() not in out[""]]
    return out


def frr_changes(before: list[str], after: list[str]) -> list[tuple[str, str, bool]]:
    """The FRR lines that differ between blocks ``before`` and ``after``, as ``(stanza head,
    line, present after)``; the head is "" for a top-level line. Same order as :func:`frr_delta`."""
    b, a = _stanzas(before), _stanzas(after)
    out: list[tuple[str, str, bool]] = []
    for head in sorted(set(b) | set(a)):
        out += [(head, x, False) for x in b.get(head, []) if x not in a.get(head, [])]
        out += [(head, x, True) for x in a.get(head, []) if x not in b.get(head, [])]
    return out


def frr_lines(changes: list[tuple[str, str, bool]]) -> list[str]:
    """vtysh configuration lines making each ``(head, line, present)`` true (FRR CLI negation
    for an absent one: :func:`substrate.devstate.frr_negate`, so ``no description`` without its
    text and ``X`` for a ``no X`` line), grouped by stanza; the inverse of :func:`frr_changes`."""
    from substrate.devstate import frr_negate

    out: list[str] = []
    heads: dict[str, list[str]] = {}
    for head, line, present in changes:
        heads.setdefault(head, []).append(line if present else frr_negate(line))
    for head in sorted(heads):
        out += ([head, *heads[head], "exit"] if head else heads[head])
    return out


def frr_delta(before: list[str], after: list[str]) -> list[str]:
    """vtysh configuration lines turning FRR blocks ``before`` into ``after``: per context
    (e.g. ``interface eth5``), ``no <line>`` for lines gone, then new lines (FRR CLI negation)."""
    return frr_lines(frr_changes(before, after))
