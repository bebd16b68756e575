"""The scripted operator's A2 (NETCONF/YANG) moves: read the PEs' policy rules and SIDs from the
running datastore through the models, and turn a per-PE change (``ConfigDelta`` in ip/FRR form,
derived from the design document exactly as at A0/A1) into an edit-config payload for the
candidate. Pure functions; the agent (``harness.agents.scripted``) does the tool calls.
"""

from __future__ import annotations

import re
from typing import Any

from lxml import etree

from substrate.netconf.device import (
    KERNEL_NS,
    address_xml,
    parse_route,
    parse_rule,
    route_xml,
    rule_xml,
)
from substrate.scenario.apply import ConfigDelta

K = f"{{{KERNEL_NS}}}"
#: The subtree filter an operator uses to read a PE's rules and main-table SIDs.
PE_FILTER = f'<kernel xmlns="{KERNEL_NS}"><rule/><table><id>254</id></table></kernel>'


def pe_facts(xml: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """IPv6 rules, main-table routes and IPv4 rules of a get-config answer, shaped like
    iproute2's JSON (``priority``, ``dst``, ``iif``, ``fwmark``, ``table`` / ``dst``, ``encap``,
    ``action``, ``table``, ``nh4``), which is what the operator's planning reads."""
    root = etree.fromstring(xml.encode(), etree.XMLParser(resolve_entities=False, no_network=True))
    rules, routes, rules4 = [], [], []
    for r in root.iter(f"{K}rule"):
        fam = r.findtext(f"{K}family")
        if fam not in ("ipv6", "ipv4"):
            continue
        d: dict[str, Any] = {"priority": int(r.findtext(f"{K}priority") or 0)}
        for tag, key in (("to", "dst"), ("from", "src"), ("iif", "iif")):
            v = r.findtext(f"{K}{tag}")
            if v and v != "all":
                d[key] = v
        if r.findtext(f"{K}fwmark"):
            d["fwmark"] = r.findtext(f"{K}fwmark")
        if r.findtext(f"{K}table"):
            d["table"] = r.findtext(f"{K}table")
        (rules if fam == "ipv6" else rules4).append(d)
    for t in root.iter(f"{K}table"):
        if t.findtext(f"{K}id") != "254":
            continue
        for rt in t.iter(f"{K}route"):
            d = {"dst": rt.findtext(f"{K}destination")}
            sl = rt.find(f"{K}seg6local")
            if sl is not None:
                d["encap"] = "seg6local"
                d["action"] = sl.findtext(f"{K}action")
                for k in ("table", "nh4", "nh6"):
                    if sl.findtext(f"{K}{k}"):
                        d[k] = sl.findtext(f"{K}{k}")
            routes.append(d)
    return rules, routes, rules4


def edit_payload(delta: ConfigDelta) -> str:
    """The edit-config ``<config>`` content for one PE's change: removals as ``remove``
    operations (absent is fine), routes as ``replace`` (``ip route replace``), rules and
    addresses as merges, an nftables table as a ``replace`` of the whole table (``remove``
    when it goes: the model's list entry, :func:`nft_table_xml`)."""
    kernel: list[str] = []
    lib: list[str] = []
    for x in delta.removals:
        fam, _, rest = x.partition(" ")
        words = rest.split()
        if words[:2] == ["route", "flush"]:  # a whole table (the over-broad delete)
            kernel.append(f'<table xmlns:nc="urn:ietf:params:xml:ns:netconf:base:1.0" nc:operation="delete">'
                          f"<id>{words[3]}</id></table>")
        elif words[:2] == ["route", "del"]:
            kernel.append(route_xml(parse_route(" ".join(words[2:])), "remove"))
        elif words[:2] == ["rule", "del"]:
            kernel.append(rule_xml(parse_rule(" ".join(words[2:]), 6 if fam == "-6" else 4), "remove"))
    for x in delta.additions:
        fam, _, rest = x.partition(" ")
        words = rest.split()
        if words[:2] in (["route", "replace"], ["route", "add"]):
            # replace, not merge: a route's segment list is a leaf-list, which merge would extend
            kernel.append(route_xml(parse_route(" ".join(words[2:])), "replace"))
        elif words[:2] == ["rule", "add"]:
            kernel.append(rule_xml(parse_rule(" ".join(words[2:]), 6 if fam == "-6" else 4)))
    ifname = None
    for line in delta.frr:
        w = line.split()
        if w[:1] == ["interface"] and len(w) == 2:
            ifname = w[1]
        elif w == ["exit"]:
            ifname = None
        elif ifname and len(w) >= 3 and w[-2] == "address" and w[-3] in ("ip", "ipv6"):
            lib.append(address_xml(ifname, w[-1], "remove" if w[0] == "no" else None))
    for table, text in sorted(delta.nft.items()):
        kernel.append(nft_table_xml(table, text))
    out = "".join(lib)
    if kernel:
        out += f'<kernel xmlns="{KERNEL_NS}">{"".join(kernel)}</kernel>'
    return out


def table_routes(xml: str, table: int) -> list[dict[str, Any]]:
    """The routes of kernel table ``table`` in a get-config answer, shaped like iproute2's JSON
    (``dst``, ``encap`` ``seg6`` with ``segs``, ``dev``) -- what the operator's leak discovery and
    troubleshooting read."""
    root = etree.fromstring(xml.encode(), etree.XMLParser(resolve_entities=False, no_network=True))
    out: list[dict[str, Any]] = []
    for t in root.iter(f"{K}table"):
        if t.findtext(f"{K}id") != str(table):
            continue
        for rt in t.iter(f"{K}route"):
            d: dict[str, Any] = {"dst": rt.findtext(f"{K}destination")}
            s6 = rt.find(f"{K}seg6")
            if s6 is not None:
                d.update(encap="seg6", segs=[x.text for x in s6.iter(f"{K}segment")])
            if rt.findtext(f"{K}device"):
                d["dev"] = rt.findtext(f"{K}device")
            out.append(d)
    return out


def nft_filter(family: str, name: str) -> str:
    """The subtree filter that reads one nftables table (``anibench-kernel``'s ``nftables``)."""
    return f'<kernel xmlns="{KERNEL_NS}"><nftables><table><family>{family}</family><name>{name}</name></table></nftables></kernel>'


def nft_tables(xml: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The nftables tables of a get-config answer in :func:`substrate.netconf.device.parse_nft`
    form: (family, name) -> ``chains`` (``name``, base-chain ``type``/``hook``/``device``/
    ``priority``/``policy``, ``rules`` in order) and ``other``."""
    root = etree.fromstring(xml.encode(), etree.XMLParser(resolve_entities=False, no_network=True))
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for nf in root.iter(f"{K}nftables"):
        for t in nf.findall(f"{K}table"):
            chains = []
            for c in t.findall(f"{K}chain"):
                ch: dict[str, Any] = {"name": c.findtext(f"{K}name"), "rules": [x.text or "" for x in c.findall(f"{K}rule")]}
                for k in ("type", "hook", "device", "priority", "policy"):
                    if c.findtext(f"{K}{k}"):
                        ch[k] = c.findtext(f"{K}{k}")
                chains.append(ch)
            out[(t.findtext(f"{K}family") or "", t.findtext(f"{K}name") or "")] = {
                "chains": chains, "other": [x.text or "" for x in t.findall(f"{K}other")]}
    return out


def _as_nft_prints(rule: str) -> str:
    """A rule as nft lists it, which is how the model holds it (the server checks the committed
    rule against the device's listing): a mark as eight hex digits (``meta mark set 0x101`` is
    listed ``0x00000101``)."""
    return re.sub(r"\b(mark set) 0x([0-9a-fA-F]+)\b", lambda m: f"{m.group(1)} 0x{int(m.group(2), 16):08x}", rule)


def nft_table_xml(table: str, text: str | None) -> str:
    """``<nftables><table>`` replacing table ``table`` (``"inet tenant_fw"``) by the ``nft -f``
    text ``text``, or removing it (None)."""
    from xml.sax.saxutils import escape

    from substrate.netconf.device import parse_nft

    fam, name = table.split()
    nc = 'xmlns:nc="urn:ietf:params:xml:ns:netconf:base:1.0"'
    keys = f"<family>{fam}</family><name>{name}</name>"
    if text is None:
        return f'<nftables><table {nc} nc:operation="remove">{keys}</table></nftables>'
    t = parse_nft(text).get((fam, name)) or {"chains": [], "other": []}
    body = ""
    for c in t["chains"]:
        inner = f"<name>{escape(c['name'])}</name>"
        for k in ("type", "hook", "device", "priority", "policy"):
            if c.get(k):
                inner += f"<{k}>{escape(str(c[k]))}</{k}>"
        inner += "".join(f"<rule>{escape(_as_nft_prints(r))}</rule>" for r in c["rules"])
        body += f"<chain>{inner}</chain>"
    body += "".join(f"<other>{escape(o)}</other>" for o in t["other"])
    return f'<nftables><table {nc} nc:operation="replace">{keys}{body}</table></nftables>'
