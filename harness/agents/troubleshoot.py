"""The scripted operator's troubleshooting (task class ``troubleshooting``, harness.troubleshooting).

The operator reads the customer's report (request.yaml: the sites or routers involved, a port, a
floating IP), the tenant's sites (sites.csv) and design.md, then checks on the devices involved,
in order, every way the design can be violated there -- it does not know which breakage was
drawn -- and repairs what deviates:

1. attachment-circuit ports of the reported sites up (``ip -j link show dev PORT``), and the
   sites' routes in the tenant table out of them (design.md: ``PREFIX table T dev PORT``; the
   kernel deletes such a route when its link goes down);
2. the sites' policy rules into the tenant table (design.md: ``priority 1000 iif PORT lookup T``,
   both families where the site has them), the table read off another site's rule;
3. the tenant's End.DT6 SID on each of its PEs: the function the other PEs' encap routes point
   to must be ``End.DT6 table T`` (RFC 8986 section 4.6);
4. with a port in the report: the first rule of the destination's tenant chain (``inet tenant_fw``)
   matching the reported flow must not drop it -- a drop met before the flow's accept (or an
   identical earlier copy of a rule) shadows it and is deleted (nft(8): first match wins);
5. with a floating IP: the border PE's DNAT for it must lead to the reported site's CE (``.2`` of
   its IPv4 prefix);
6. with routers named (a core link): each end's interface toward the other carries the IS-IS
   lines its peer's end carries (``ipv6 router isis``, hello, metric, network type).

Pure functions plan the repair from what was read; :class:`Hands` does the reading and the
change at the agent's level (A0: shell; A1: execute_validation / apply_config; A2:
:class:`NetconfHands`, get-config / edit-config through the models). At A3-R and A4
the reconciler reverts the drift on its own (draft 5.1, A3-R: drift detection and reconciliation);
the operator confirms it with reconcile_status.
"""

from __future__ import annotations

import ipaddress
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from harness.agents.base import ToolSession

TENANT_FW = ("inet", "tenant_fw")
FIP = ("ip", "fip")
RULE_PRIO_TENANT = 1000


@dataclass
class Fix:
    """A repair on one device: kernel commands (``ip ...``/``nft ...`` words) and FRR lines
    (configuration mode, ``interface X`` first), and at A1 the FRR form of a link brought up."""

    device: str
    kernel: list[str] = field(default_factory=list)
    frr: list[str] = field(default_factory=list)
    links_up: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)


class Hands:
    """Reads and changes devices at level ``level`` (A0 or A1) through ``tools``."""

    def __init__(self, tools: ToolSession, level: str):
        self.tools, self.level = tools, level

    async def read(self, device: str, command: str) -> str:
        """The output of one read-only command (empty when the device refused it)."""
        if self.level == "A1":
            r = await self.tools.call_full("execute_validation", {"commands": {device: [command]}})
            if not r.ok or r.data is None:
                return ""
            text = r.data["devices"][device]["output"]
            return text.split("\n", 1)[1] if "\n" in text else ""
        if command.startswith("show "):  # an FRR command: through vtysh in the shell
            command = f"vtysh -c '{command}'"
        r = await self.tools.call_full("run_shell", {"device": device, "command": command})
        if not r.ok or r.data is None:
            return ""
        return r.data.get("stdout") or ""

    async def json(self, device: str, command: str) -> Any:
        text = await self.read(device, command)
        try:
            return json.loads(text or "[]")
        except ValueError:
            return []

    async def apply(self, fix: Fix) -> None:
        if self.level == "A1":
            lines = list(fix.kernel)
            for port in fix.links_up:
                lines += [f"interface {port}", "no shutdown", "exit"]
            lines += fix.frr
            await self.tools.call("apply_config", {"commands": {fix.device: lines}})
            return
        script = [f"ip link set {p} up" for p in fix.links_up]
        script += [_shell_nft(k) if k.startswith("nft ") else k for k in fix.kernel]
        if fix.frr:
            script.append("vtysh -c 'configure terminal' " + " ".join(f"-c '{x}'" for x in fix.frr))
        await self.tools.call("run_shell", {"device": fix.device, "command": " && ".join(script)})


class NetconfHands(Hands):
    """The same reads and repairs at A2, through the models (get-config / edit-config + commit):
    rules, main-table SIDs and tenant-table routes read as :mod:`harness.agents.a2_operator`
    does and shaped like iproute2's JSON; an nftables table listed with synthetic handles (the
    rule's position in the table, the model has none) so the same plans apply, and an nft delete
    or replace by such a handle turned into a replace of the whole table (the model's unit).
    What the models do not hold reads as nothing to repair: the kernel link state (the
    ``link_down`` breakage is marked inexpressible at A2) and FRR's IS-IS interface lines (the
    A2 edit payloads carry kernel objects and addresses only: ``isis_interface_removed``)."""

    def __init__(self, tools: ToolSession, get_config: Any):
        super().__init__(tools, "A2")
        self.get_config = get_config
        self.tables: dict[tuple[str, str], dict[str, Any]] = {}  # (device, "fam name") -> table last listed

    async def _kernel(self, device: str, flt: str) -> str:
        return await self.get_config(device, f'<kernel xmlns="urn:anibench:yang:kernel">{flt}</kernel>')

    async def read(self, device: str, command: str) -> str:
        m = re.fullmatch(r"nft -a list (table|chain) (\S+) (\S+)(?: (\S+))?", command)
        if not m:
            return ""
        from harness.agents.a2_operator import nft_filter, nft_tables

        fam, name, chain = m.group(2), m.group(3), m.group(4)
        t = nft_tables(await self.get_config(device, nft_filter(fam, name))).get((fam, name))
        if t is None:
            return ""
        self.tables[(device, f"{fam} {name}")] = t
        lines, h = [f"table {fam} {name} {{"], 0
        for c in t["chains"]:
            lines.append(f"\tchain {c['name']} {{")
            for r in c["rules"]:
                h += 1
                if chain is None or c["name"] == chain:
                    lines.append(f"\t\t{r} # handle {h}")
            lines.append("\t}")
        return "\n".join([*lines, "}"])

    async def json(self, device: str, command: str) -> Any:
        from harness.agents.a2_operator import PE_FILTER, pe_facts, table_routes

        w = command.split()
        if w[:2] == ["ip", "-j"] and w[2:4] == ["link", "show"]:
            return [{"flags": ["UP"]}]  # no kernel link state in the models (see the class docstring)
        if w[-2:] == ["rule", "show"]:
            rules6, _routes, rules4 = pe_facts(await self.get_config(device, PE_FILTER))
            return rules6 if w[1] == "-6" else rules4
        if w[-3:-1] == ["show", "table"]:
            table = w[-1]
            if table == "main":
                return pe_facts(await self.get_config(device, PE_FILTER))[1]
            routes = table_routes(await self._kernel(device, f"<table><id>{table}</id></table>"), int(table))
            fam = 6 if "-6" in w else 4
            return [r for r in routes if (":" in (r.get("dst") or "")) == (fam == 6)]
        return []

    async def apply(self, fix: Fix, commit: bool = True) -> None:
        """The repair as one edit-config, committed (``commit=False``: left in the candidate,
        the noisy agent's uncommitted mistake); a refused edit or commit is discarded."""
        from harness.agents.a2_operator import edit_payload
        from substrate.netconf.device import render_nft_table
        from substrate.scenario.apply import ConfigDelta

        d = ConfigDelta(node=fix.device)
        for k in fix.kernel:
            w = k.split()
            if w[0] == "ip":
                (d.removals if w[3] == "del" else d.additions).append(" ".join(w[1:]))
                continue
            m = re.fullmatch(r"nft (delete|replace) rule (\S+) (\S+) (\S+) handle (\d+)(?: (.*))?", k)
            if not m or (fix.device, f"{m.group(2)} {m.group(3)}") not in self.tables:
                continue
            t = self.tables[(fix.device, f"{m.group(2)} {m.group(3)}")]
            h = 0
            for c in t["chains"]:
                for i in range(len(c["rules"])):
                    h += 1
                    if h == int(m.group(5)):
                        # the model holds a rule as nft prints it: interface names quoted
                        c["rules"][i] = None if m.group(1) == "delete" else re.sub(
                            r'\b(iifname|oifname) (?!")(\S+)', r'\1 "\2"', m.group(6) or "")
            d.nft[f"{m.group(2)} {m.group(3)}"] = None  # marked; rendered below
        for key in list(d.nft):
            t = self.tables[(fix.device, key)]
            for c in t["chains"]:
                c["rules"] = [r for r in c["rules"] if r is not None]
            d.nft[key] = render_nft_table(*key.split(), t) + "\n"
        if d.empty():
            return
        r = await self.tools.call("edit_config", {"device": fix.device, "config": edit_payload(d)})
        if r.ok and not commit:
            return
        if r.ok:
            r = await self.tools.call("commit", {"device": fix.device})
        if not r.ok:
            await self.tools.call("discard_changes", {"device": fix.device})


def _shell_nft(cmd: str) -> str:
    """An nft command for a shell: its rule text as one quoted argument (braces, semicolons)."""
    return "nft " + "'" + cmd[len("nft "):] + "'"


@dataclass
class Report:
    """The ticket (request.yaml of a troubleshooting variant) and the tenant's sites."""

    tenant: str
    sites: dict[str, dict[str, str]]
    from_site: str | None = None
    to_site: str | None = None
    port: int | None = None
    floating_ip: str | None = None
    routers: list[str] = field(default_factory=list)


def read_report(files: dict[str, str]) -> Report:
    """Parse a troubleshooting ticket. Raises KeyError / ValueError on a malformed one."""
    import csv
    import io

    req = yaml.safe_load(files["request.yaml"]) or {}
    sites = {s["site"]: s for s in csv.DictReader(io.StringIO(files.get("sites.csv", "")))}
    routers = [str(x) for x in req.get("routers") or []]
    if not routers:
        m = re.search(r"between (r\d+) and (r\d+)", str(req.get("report", "")))
        routers = list(m.groups()) if m else []
    return Report(tenant=str(req["tenant"]), sites=sites, from_site=req.get("from_site"), to_site=req.get("to_site"),
                  port=int(req["port"]) if req.get("port") is not None else None, floating_ip=req.get("floating_ip"),
                  routers=routers)


def _host(prefix: str, n: int) -> str:
    return str(ipaddress.ip_network(prefix).network_address + n)


def _sid_function(sid: str) -> tuple[int, int]:
    """(node id group, function) of a uSID ``fcbb:bb00:<N>:<F>::`` (design.md)."""
    g = ipaddress.IPv6Address(sid.split("/")[0]).exploded.split(":")
    return int(g[2], 16), int(g[3], 16)


def table_of(rules6: list[dict[str, Any]], ports: set[str]) -> int | None:
    """The tenant table: what a policy rule of one of the tenant's ports looks up (``rules6``
    and ``ports`` of one PE: a port name means a circuit only on its own PE)."""
    for r in rules6:
        if r.get("iif") in ports and str(r.get("table", "")).isdigit():
            return int(r["table"])
    return None


def tenant_table(sites: dict[str, dict[str, str]], rules6: dict[str, list[dict[str, Any]]]) -> int | None:
    """The tenant's table, read off the policy rules (``ip -6 -j rule show`` per PE in
    ``rules6``) of the tenant's attachment-circuit ports (sites.csv rows: ``pe``, ``pe_port``):
    each PE is asked about its own ports only -- the same port name on another PE is another
    tenant's circuit. None when no PE shows a rule of the tenant's ports."""
    for pe in sorted(rules6):
        own = {s["pe_port"] for s in sites.values() if s["pe"] == pe}
        if own and (t := table_of(rules6[pe], own)) is not None:
            return t
    return None


def rule_fixes(pe: str, site_ports: dict[str, bool], table: int, rules6: list[dict[str, Any]],
               rules4: list[dict[str, Any]]) -> list[str]:
    """The rules missing on ``pe`` for the sites whose ports are ``site_ports`` (port -> has IPv4)."""
    out = []
    for port, has4 in sorted(site_ports.items()):
        for fam, rules, want in ((6, rules6, True), (4, rules4, has4)):
            if want and not any(r.get("iif") == port and str(r.get("table")) == str(table) for r in rules):
                out.append(f"ip -{fam} rule add priority {RULE_PRIO_TENANT} iif {port} lookup {table}")
    return out


def sid_fix(pe: str, function: int, table: int, main6: list[dict[str, Any]]) -> str | None:
    """The route that makes ``pe``'s SID ``function`` End.DT6 into ``table`` again, or None when it is."""
    for r in main6:
        dst = r.get("dst", "")
        if r.get("encap") == "seg6local" and "/" in dst and _sid_function(dst)[1] == function:
            if r.get("action") == "End.DT6" and str(r.get("table")) == str(table):
                return None
            return f"ip -6 route replace {dst} metric 1024 encap seg6local action End.DT6 table {table} count dev sr0"
    return None  # no route at all for the function: not this check's to guess


_RULE = re.compile(r"^\s*(?P<body>.*?)\s+(?P<verdict>accept|drop)\s+# handle (?P<handle>\d+)\s*$")


def _matches(body: str, fam: int, src: str | None, dst: str, port: int) -> bool:
    """Whether the rule ``body`` (nft's listing, match part) matches TCP ``port`` from ``src``
    to ``dst`` (addresses) in family ``fam``: only the forms the design uses are read."""
    kw = "ip6" if fam == 6 else "ip"
    words = body.split()
    if any(w in ("ip", "ip6") for w in words) and kw not in words:
        return False
    for field_, addr in (("saddr", src), ("daddr", dst)):
        m = re.search(rf"\b{kw} {field_} (\S+)", body)
        if m:
            if addr is None or ipaddress.ip_address(addr) not in ipaddress.ip_network(m.group(1), strict=False):
                return False
    m = re.search(r"tcp dport (\d+)", body)
    return not (m and int(m.group(1)) != port)


def shadow_fixes(listing: str, chain: str, flows: list[tuple[int, str | None, str]], port: int) -> list[str]:
    """Deletes of the rules of ``chain`` (``nft -a list chain`` text) that drop an allowed flow
    before it reaches its accept: for each flow (family, source, destination address), while
    the first matching rule is a drop and an accept for the flow follows, or an identical rule
    follows (a copy), that rule goes."""
    rules = [(m.group("body"), m.group("verdict"), int(m.group("handle"))) for m in map(_RULE.match, listing.splitlines()) if m]
    gone: set[int] = set()
    for fam, src, dst in flows:
        while True:
            live = [r for r in rules if r[2] not in gone and _matches(r[0], fam, src, dst, port)]
            if not live or live[0][1] != "drop":
                break
            first = live[0]
            later = live[1:]
            if any(v == "accept" for _, v, _ in later) or any(b == first[0] and v == first[1] for b, v, _ in later):
                gone.add(first[2])
            else:
                break
    return [f"nft delete rule {TENANT_FW[0]} {TENANT_FW[1]} {chain} handle {h}" for h in sorted(gone)]


def nat_fix(listing: str, address: str, ce4: str) -> str | None:
    """The replace that points the DNAT of ``address`` (``nft -a list table ip fip`` text) at ``ce4``."""
    chain = None
    for line in listing.splitlines():
        m = re.match(r"\s*chain (\S+) \{", line)
        if m:
            chain = m.group(1)
        m = re.match(r"\s*(?P<body>.*\bip daddr " + re.escape(address) + r" dnat to (?P<to>\S+))\s+# handle (?P<h>\d+)", line)
        if m and chain:
            if m.group("to") == ce4:
                return None
            body = m.group("body").replace(f"dnat to {m.group('to')}", f"dnat to {ce4}").replace('"', "")
            return f"nft replace rule {FIP[0]} {FIP[1]} {chain} handle {m.group('h')} {body}"
    return None


def interface_blocks(running: str) -> dict[str, list[str]]:
    """Interface name -> its lines (stripped) in FRR's running configuration."""
    out: dict[str, list[str]] = {}
    cur = None
    for line in running.splitlines():
        m = re.match(r"^interface (\S+)", line)
        if m:
            cur = m.group(1)
            out[cur] = []
        elif line.strip() in ("exit", "!") or not line.startswith(" "):
            cur = None
        elif cur:
            out[cur].append(line.strip())
    return out


def isis_fix(me: str, mine: dict[str, list[str]], peer: str, theirs: dict[str, list[str]]) -> list[str]:
    """FRR lines giving ``me``'s interface toward ``peer`` the IS-IS lines the peer's interface
    toward ``me`` has and it lacks (empty when nothing is missing)."""
    def toward(blocks: dict[str, list[str]], other: str) -> str | None:
        return next((i for i, ls in blocks.items() if f"description to {other}" in ls), None)

    a, b = toward(mine, peer), toward(theirs, me)
    if a is None or b is None:
        return []
    want = [x for x in theirs[b] if x.startswith(("ipv6 router isis", "isis "))]
    missing = [x for x in want if x not in mine[a]]
    return [f"interface {a}", *missing, "exit"] if missing else []


class NoisyHands:
    """Hands that make the noisy agent's mistakes in the repairs they apply
    (:func:`harness.agents.mistakes.fix_mistake`, placed by :meth:`Mistakes.one`); reads pass
    through. ``env`` is filled as the operator reads (the tenant's rules)."""

    def __init__(self, hands: Hands, mistakes: Any, env: Any):
        self.hands, self.mistakes, self.env = hands, mistakes, env
        self.level, self.tools = hands.level, hands.tools

    async def read(self, device: str, command: str) -> str:
        return await self.hands.read(device, command)

    async def json(self, device: str, command: str) -> Any:
        return await self.hands.json(device, command)

    async def apply(self, fix: Fix, commit: bool = True) -> None:
        from harness.agents.mistakes import fix_mistake

        def render(k: str) -> Any:
            return fix_mistake(k, fix.kernel, fix.frr, fix.links_up, fix.device, self.env)

        kind = self.mistakes.one(lambda k: render(k) is not None)
        m = render(kind) if kind else None
        if m is None:
            await self.hands.apply(fix)
            return
        self.mistakes.record(kind, fix.device)
        wrong = Fix(device=m.device, kernel=m.kernel, frr=m.frr, links_up=m.links_up, why=fix.why)
        if isinstance(self.hands, NetconfHands):
            await self.hands.apply(wrong, commit=m.commit)
        else:
            await self.hands.apply(wrong)


async def troubleshoot(tools: ToolSession, files: dict[str, str], level: str, *, get_config: Any = None,
                       mistakes: Any = None) -> list[str]:
    """Diagnose and repair at A0, A1 or A2 (see module docstring; A2 reads through
    ``get_config(device, filter) -> xml``, :class:`NetconfHands`). Returns what was repaired.
    ``mistakes`` (:class:`harness.agents.mistakes.Mistakes`): the noisy agent's, made in the
    repairs (:class:`NoisyHands`)."""
    from harness.agents.mistakes import FixEnv

    rep = read_report(files)
    hands: Any = NetconfHands(tools, get_config) if level == "A2" else Hands(tools, level)
    done: list[str] = []
    named = [s for s in (rep.from_site, rep.to_site) if s and s in rep.sites]
    tenant_pes = sorted({s["pe"] for s in rep.sites.values()})
    if mistakes is not None:
        own: dict[str, set[str]] = {}
        for s in rep.sites.values():
            own.setdefault(s["pe"], set()).add(s["pe_port"])
        hands = NoisyHands(hands, mistakes, FixEnv(level=level, routers=[*tenant_pes, *rep.routers], own_ports=own))
    try:
        return await _troubleshoot(hands, rep, named, tenant_pes, done)
    finally:
        if mistakes is not None:
            mistakes.finish()


async def _troubleshoot(hands: Any, rep: Report, named: list[str], tenant_pes: list[str], done: list[str]) -> list[str]:
    if rep.sites:
        rules6 = {pe: await hands.json(pe, "ip -6 -j rule show") for pe in tenant_pes}
        if isinstance(hands, NoisyHands):
            hands.env.rules6 = rules6
        table = tenant_table(rep.sites, rules6)
        for sid in named:
            s = rep.sites[sid]
            link = await hands.json(s["pe"], f"ip -j link show dev {s['pe_port']}")
            if link and "UP" not in (link[0].get("flags") or []):
                await hands.apply(Fix(device=s["pe"], links_up=[s["pe_port"]]))
                done.append(f"{s['pe']} {s['pe_port']} up")
        if table is not None:
            for pe in tenant_pes:
                here = {s["pe_port"]: bool(s.get("prefix4")) for s in rep.sites.values() if s["pe"] == pe and s["site"] in named}
                if not here:
                    continue
                rules4 = await hands.json(pe, "ip -4 -j rule show")
                k = rule_fixes(pe, here, table, rules6[pe], rules4)
                if k:
                    await hands.apply(Fix(device=pe, kernel=k))
                    done += [f"{pe}: {x}" for x in k]
            # a site's route in the tenant table out of its port (the kernel drops it with the link)
            for sid in named:
                st = rep.sites[sid]
                k = []
                for fam, prefix, metric in ((6, st["prefix6"], " metric 1024"), (4, st.get("prefix4"), "")):
                    if not prefix:
                        continue
                    routes = await hands.json(st["pe"], f"ip -{fam} -j route show table {table}")
                    if not any(r.get("dst") == prefix and r.get("dev") == st["pe_port"] for r in routes):
                        k.append(f"ip -{fam} route replace {prefix} table {table}{metric} dev {st['pe_port']}")
                if k:
                    await hands.apply(Fix(device=st["pe"], kernel=k))
                    done += [f"{st['pe']}: {x}" for x in k]
            # the function each PE's SID has, as the other PEs' encap routes toward its sites say
            functions: dict[str, int] = {}
            for pe in tenant_pes:
                routes = await hands.json(pe, f"ip -6 -d -j route show table {table}")
                for r in routes:
                    if r.get("encap") == "seg6" and r.get("segs"):
                        seg = r["segs"][0] if isinstance(r["segs"], list) else str(r["segs"]).split(",")[0]
                        nid, fn = _sid_function(seg)
                        target = next((p for p in tenant_pes if p == f"r{nid:x}"), None)
                        dst = r.get("dst", "")
                        owner = next((s for s in rep.sites.values() if s["prefix6"] == dst), None)
                        if target and owner and owner["pe"] == target and target != pe:
                            functions.setdefault(target, fn)
            for pe, fn in sorted(functions.items()):
                k = sid_fix(pe, fn, table, await hands.json(pe, "ip -6 -d -j route show table main"))
                if k:
                    await hands.apply(Fix(device=pe, kernel=[k]))
                    done.append(f"{pe}: {k}")
    if rep.port is not None and rep.to_site in rep.sites:
        dst = rep.sites[rep.to_site]
        src = rep.sites.get(rep.from_site or "")
        fw = await hands.read(dst["pe"], f"nft -a list table {' '.join(TENANT_FW)}")
        m = re.search(rf'oifname "?{re.escape(dst["pe_port"])}"? jump (\S+)', fw)
        if m:
            chain = m.group(1)
            listing = await hands.read(dst["pe"], f"nft -a list chain {' '.join(TENANT_FW)} {chain}")
            flows: list[tuple[int, str | None, str]] = [(6, _host(src["prefix6"], 2) if src else None, _host(dst["prefix6"], 2))]
            if dst.get("prefix4") and (src is None or src.get("prefix4")):
                flows.append((4, _host(src["prefix4"], 2) if src else None, _host(dst["prefix4"], 2)))
            k = shadow_fixes(listing, chain, flows, rep.port)
            if k:
                await hands.apply(Fix(device=dst["pe"], kernel=k))
                done += [f"{dst['pe']}: {x}" for x in k]
    if rep.floating_ip and rep.to_site in rep.sites and rep.sites[rep.to_site].get("prefix4"):
        ce4 = _host(rep.sites[rep.to_site]["prefix4"], 2)
        for router in await _routers(hands, tenant_pes):
            listing = await hands.read(router, f"nft -a list table {' '.join(FIP)}")
            if f"ip daddr {rep.floating_ip} " in listing:
                k = nat_fix(listing, rep.floating_ip, ce4)
                if k:
                    await hands.apply(Fix(device=router, kernel=[k]))
                    done.append(f"{router}: {k}")
                break
    if len(rep.routers) == 2:
        a, b = rep.routers
        ra = interface_blocks(await hands.read(a, "show running-config"))
        rb = interface_blocks(await hands.read(b, "show running-config"))
        for me, mine, peer, theirs in ((a, ra, b, rb), (b, rb, a, ra)):
            lines = isis_fix(me, mine, peer, theirs)
            if lines:
                await hands.apply(Fix(device=me, frr=lines))
                done.append(f"{me}: {' / '.join(lines)}")
    return done


async def _routers(hands: Hands, first: list[str]) -> list[str]:
    """Routers to look for a floating IP's NAT on: the tenant's PEs first, then every other PE
    and P router the level lists (A0 list_devices, A1 get_topology)."""
    tool, key = ("get_topology", "nodes") if hands.level == "A1" else ("list_devices", "devices")  # A2 too
    r = await hands.tools.call(tool, {})
    data = r.data if r.ok and isinstance(r.data, dict) else {}
    names = [d["name"] for d in data.get(key) or [] if isinstance(d, dict) and d.get("role") in ("P", "PE")]
    return first + [n for n in names if n not in first]


#: How long the A3-R / A4 operator waits for the reconciler's repair, and the spacing of its
#: reconcile_status polls: a repair takes about a minute when the reconciler's pre-check pings the
#: broken tenant until its timeout (measured ~60 s); 300 s / 10 s is at most 31 calls, inside the
#: default step budget of 40 (harness.run.RunSpec.budget_steps).
RECONCILE_WAIT_S = 300.0
RECONCILE_POLL_S = 10.0


async def await_reconciled(tools: ToolSession, *, timeout_s: float = RECONCILE_WAIT_S, pause_s: float = RECONCILE_POLL_S,
                           clock: Callable[[], float] = time.monotonic,
                           sleep: Callable[[float], Awaitable[None]] | None = None) -> bool:
    """A3-R / A4: poll reconcile_status until the reconciler has found and reverted the drift
    (or found none) since the server started: in_sync with a record of this server's epoch.

    Bounded by time, not by a count: polls ``pause_s`` seconds apart (``sleep``, anyio's by
    default) until ``timeout_s`` seconds (``clock``) have passed, one last poll at the bound --
    at most ``timeout_s / pause_s + 1`` calls. The spacing is the operator's own: A3-R's ``wait``
    tool returns as soon as HEAD is applied, which it already is while the reconciler reverts
    drift, and A4 has none. Returns whether the reconciler reported in sync in time."""
    if sleep is None:
        import anyio

        sleep = anyio.sleep
    deadline = clock() + timeout_s
    while True:
        st = await tools.call("reconcile_status", {})
        d = st.data or {}
        if st.ok and d.get("in_sync") and d.get("recent"):
            return True
        left = deadline - clock()
        if left <= 0:
            return False
        await sleep(min(pause_s, left))
