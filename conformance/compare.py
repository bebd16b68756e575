"""Compare the conformance results of the two data planes and say every difference.

``python3 -m conformance.compare KERNEL.json EBPF.json [--json]``

Items compared (issue 34, "Conformance against the kernel itself"):

- every command of the corpus (``corpus/commands.txt``), the probe path's set-up commands
  (``corpus/probes.txt``) and the routers' counters after the probes: exit status, stdout and
  stderr, byte for byte;
- every packet probe: the frames received on each of the eight veth ends, byte for byte, after
  :func:`normalise_frame`.

What is normalised, and why (nothing else is):

- the IPv4 identification and header checksum of IPv4 headers that h1 did not write (h3's echo
  replies, a router's ICMP errors), at any depth: Linux picks the identification of a packet
  without DF from a keyed hash (``ip_select_ident``, a per-boot random key), so it differs between
  any two boots, data plane aside. Those h1 wrote (the probes, every field chosen) are compared
  whole.

No flow label needs normalising: every node runs with ``net.ipv6.auto_flowlabels=0`` (so h3's
replies and the routers' ICMP errors carry flow label 0), the probes carry fixed labels, and both
data planes copy the inner label into the outer header (``seg6_flowlabel`` 0, the kernel's
default). ICMPv6 checksums do not cover the flow label.

Each difference is matched against :data:`conformance.differences.DOCUMENTED`; one that matches
nothing is *unexplained* (a bug of the eBPF side until shown otherwise).
"""

from __future__ import annotations

import argparse
import fnmatch
import ipaddress
import json
import re
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.differences import DOCUMENTED, Documented  # noqa: E402

H1_IPV4 = bytes([10, 0, 1, 1])


@dataclass
class Item:
    """One compared thing.

    Attributes:
        kind: ``command`` or ``probe``.
        case: the case (``commands.txt``), ``probes:<node>``, ``counters:<node>``, or the probe name.
        what: the command line, or the probe's description.
        kernel: what the kernel gave (a command record, or interface -> frames).
        ebpf: what the eBPF data plane gave.
        same: whether they are identical after normalising.
        documented: the id of the documented difference it matches, if any.
    """

    kind: str
    case: str
    what: str
    kernel: object
    ebpf: object
    same: bool
    documented: str | None = None


@dataclass
class Report:
    """The comparison: items, and a word on what was run."""

    items: list[Item] = field(default_factory=list)
    environment: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Commands and probes compared, identical, documented and unexplained differences."""
        out: dict[str, int] = {}
        for kind in ("command", "probe"):
            its = [i for i in self.items if i.kind == kind]
            out[f"{kind}s"] = len(its)
            out[f"{kind}s_identical"] = sum(1 for i in its if i.same)
            out[f"{kind}s_documented"] = sum(1 for i in its if not i.same and i.documented)
            out[f"{kind}s_unexplained"] = sum(1 for i in its if not i.same and not i.documented)
        return out

    def unexplained(self) -> list[Item]:
        """The differences no documented entry explains."""
        return [i for i in self.items if not i.same and not i.documented]

    def unused_documented(self) -> list[str]:
        """Documented differences that matched nothing (stale, or fixed)."""
        used = {i.documented for i in self.items if i.documented}
        return [d.id for d in DOCUMENTED if d.id not in used]


# -- normalising ----------------------------------------------------------------------------------


def _norm_ipv4(p: bytearray, off: int) -> None:
    if len(p) < off + 20 or p[off] >> 4 != 4:
        return
    if bytes(p[off + 12:off + 16]) != H1_IPV4:
        p[off + 4:off + 6] = b"\0\0"
        p[off + 10:off + 12] = b"\0\0"


def _walk(p: bytearray, off: int, depth: int = 0) -> None:
    """Normalise the packet at ``off`` and the packets it carries (IPv6 in IPv6, IPv4 in IPv6)."""
    if depth > 4 or len(p) <= off:
        return
    v = p[off] >> 4
    if v == 4:
        _norm_ipv4(p, off)
        return
    if v != 6 or len(p) < off + 40:
        return
    nh, o = p[off + 6], off + 40
    while nh in (0, 43, 60) and len(p) >= o + 8:
        nh, o = p[o], o + (p[o + 1] + 1) * 8
    if nh in (4, 41):
        _walk(p, o, depth + 1)


def normalise_frame(frame: bytes) -> bytes:
    """The frame with only what must differ between two boots zeroed (see the module docstring)."""
    p = bytearray(frame)
    if p[12:14] in (b"\x86\xdd", b"\x08\x00"):
        _walk(p, 14)
    return bytes(p)


# -- describing frames ----------------------------------------------------------------------------


def describe(packet: bytes, depth: int = 0) -> str:
    """A one-line reading of an L3 packet's headers (for the report)."""
    if not packet or depth > 4:
        return ""
    v = packet[0] >> 4
    if v == 6 and len(packet) >= 40:
        w, plen, nh, hl = struct.unpack_from("!IHBB", packet)
        src, dst = (str(ipaddress.IPv6Address(packet[o:o + 16])) for o in (8, 24))
        s = f"IPv6 {src} > {dst} hl {hl} tc {(w >> 20) & 0xFF:#x} fl {w & 0xFFFFF:#x} len {plen}"
        o = 40
        while nh in (0, 43, 60) and len(packet) >= o + 8:
            if nh == 43 and packet[o + 2] == 4:
                n = packet[o + 4] + 1
                segs = [str(ipaddress.IPv6Address(packet[o + 8 + 16 * i:o + 24 + 16 * i])) for i in range(n)
                        if len(packet) >= o + 24 + 16 * i]  # fmt: skip
                s += f" | SRH sl {packet[o + 3]} le {packet[o + 4]} segs {segs}"
            nh, o = packet[o], o + (packet[o + 1] + 1) * 8
        if nh in (4, 41):
            return s + " | " + describe(packet[o:], depth + 1)
        if nh == 58 and len(packet) > o:
            return s + f" | ICMPv6 type {packet[o]} code {packet[o + 1]}"
        return s + f" | nh {nh}"
    if v == 4 and len(packet) >= 20:
        ihl = (packet[0] & 15) * 4
        s = (f"IPv4 {ipaddress.IPv4Address(packet[12:16])} > {ipaddress.IPv4Address(packet[16:20])} ttl {packet[8]} "
             f"tos {packet[1]:#x} id {struct.unpack_from('!H', packet, 4)[0]:#x}")  # fmt: skip
        if packet[9] == 1 and len(packet) > ihl:
            s += f" | ICMP type {packet[ihl]} code {packet[ihl + 1]}"
        return s
    return f"{len(packet)} bytes"


def _frames_text(frames: dict[str, list[str]]) -> str:
    lines = []
    for ifname in sorted(frames):
        for f in frames[ifname]:
            lines.append(f"  {ifname}: {describe(bytes.fromhex(f)[14:])}")
    return "\n".join(lines) or "  (no frame)"


# -- comparing ------------------------------------------------------------------------------------


def _doc_for(item: Item) -> Documented | None:
    for d in DOCUMENTED:
        if item.kind == "probe":
            if any(fnmatch.fnmatchcase(item.case, p) for p in d.probes):
                return d
            continue
        if any(fnmatch.fnmatchcase(item.case, c) for c in d.cases) and (d.command is None or re.search(d.command, item.what)):
            if d.ignore is not None and not _same_but(item, d.ignore):
                continue
            return d
    return None


def _same_but(item: Item, ignore: str) -> bool:
    """Whether a command's two results are equal once the groups ``ignore`` captures are blanked
    in both (exit status and standard error compared whole)."""
    k, e = item.kernel, item.ebpf
    if not isinstance(k, dict) or not isinstance(e, dict) or (k["rc"], k["stderr"]) != (e["rc"], e["stderr"]):
        return False
    return _blank(ignore, k["stdout"]) == _blank(ignore, e["stdout"])


def _blank(pattern: str, text: str) -> str:
    """``text`` with the capturing groups of every match of ``pattern`` replaced by ``#``."""
    out, at = [], 0
    for m in re.finditer(pattern, text):
        for g in range(1, (m.re.groups or 0) + 1):
            if m.start(g) >= at:
                out += [text[at:m.start(g)], "#"]
                at = m.end(g)
    return "".join(out) + text[at:]


def _command_items(kind_case: str, kernel: list[dict], ebpf: list[dict], problems: list[str]) -> list[Item]:
    kc = [r for r in kernel if r.get("plane") is None]
    ec = [r for r in ebpf if r.get("plane") is None]
    if [r["cmd"] for r in kc] != [r["cmd"] for r in ec]:
        problems.append(f"{kind_case}: the two runs ran different commands (corpus changed? re-record)")
    out = []
    for k, e in zip(kc, ec):
        same = (k["rc"], k["stdout"], k["stderr"]) == (e["rc"], e["stdout"], e["stderr"])
        out.append(Item("command", kind_case, k["cmd"], k, e, same))
    return out


def compare(kernel: dict, ebpf: dict) -> Report:
    """Compare two results documents (:func:`conformance.runner.run_all`)."""
    rep = Report(environment={"kernel": kernel.get("environment"), "ebpf": ebpf.get("environment")})
    kcases = {c["name"]: c for c in kernel.get("cases", [])}
    ecases = {c["name"]: c for c in ebpf.get("cases", [])}
    for name in kcases.keys() | ecases.keys():
        if name not in kcases or name not in ecases:
            rep.problems.append(f"case {name} ran on one data plane only")
    for name, kc in kcases.items():
        if name in ecases:
            rep.items += _command_items(name, kc["commands"], ecases[name]["commands"], rep.problems)
    kp, ep = kernel.get("probes"), ebpf.get("probes")
    if kp and ep:
        for part in ("setup", "counters"):
            e_by = {c["name"]: c for c in ep[part]}
            for c in kp[part]:
                if c["name"] in e_by:
                    prefix = "probes" if part == "setup" else "counters"
                    rep.items += _command_items(f"{prefix}:{c['name']}", c["commands"], e_by[c["name"]]["commands"], rep.problems)
        e_by = {p["name"]: p for p in ep["probes"]}
        for p in kp["probes"]:
            e = e_by.get(p["name"])
            if e is None:
                rep.problems.append(f"probe {p['name']} ran on one data plane only")
                continue
            norm = lambda fr: {k: [normalise_frame(bytes.fromhex(f)).hex() for f in v] for k, v in fr.items()}  # noqa: E731
            rep.items.append(Item("probe", p["name"], p["what"], p["frames"], e["frames"], norm(p["frames"]) == norm(e["frames"])))
    elif kp or ep:
        rep.problems.append("the packet probes ran on one data plane only")
    for it in rep.items:
        if not it.same:
            d = _doc_for(it)
            it.documented = d.id if d else None
    return rep


def _show_command(r: dict) -> str:
    out = f"    exit {r['rc']}\n"
    for stream in ("stdout", "stderr"):
        if r[stream]:
            out += f"    {stream}:\n" + "".join(f"      {line}\n" for line in r[stream].rstrip("\n").split("\n"))
    return out


def format_report(rep: Report, *, documented_details: bool = False) -> str:
    """The report as text: figures, then every difference (unexplained first)."""
    c = rep.counts()
    env = rep.environment
    lines = [
        f"kernel side: {env.get('kernel')}",
        f"eBPF side:   {env.get('ebpf')}",
        f"commands compared: {c['commands']}, identical: {c['commands_identical']}, documented differences: "
        f"{c['commands_documented']}, unexplained: {c['commands_unexplained']}",
        f"packet probes compared: {c['probes']}, identical: {c['probes_identical']}, documented differences: "
        f"{c['probes_documented']}, unexplained: {c['probes_unexplained']}",
    ]  # fmt: skip
    for p in rep.problems:
        lines.append(f"PROBLEM: {p}")
    diffs = sorted((i for i in rep.items if not i.same), key=lambda i: (i.documented is not None, i.documented or ""))
    for it in diffs:
        if it.documented and not documented_details:
            continue
        lines.append("")
        lines.append(f"{'UNEXPLAINED' if not it.documented else 'documented (' + it.documented + ')'}: [{it.case}] {it.what}")
        if it.kind == "command":
            assert isinstance(it.kernel, dict) and isinstance(it.ebpf, dict)
            if it.kernel.get("stdin"):
                lines.append("    stdin:\n" + "".join(f"      {x}\n" for x in it.kernel["stdin"].rstrip("\n").split("\n")).rstrip("\n"))
            lines.append("  kernel:\n" + _show_command(it.kernel).rstrip("\n"))
            lines.append("  ebpf:\n" + _show_command(it.ebpf).rstrip("\n"))
        else:
            lines.append("  kernel:\n" + _frames_text(it.kernel))  # type: ignore[arg-type]
            lines.append("  ebpf:\n" + _frames_text(it.ebpf))  # type: ignore[arg-type]
    documented = {}
    for it in diffs:
        if it.documented:
            documented.setdefault(it.documented, []).append(it)
    if documented:
        lines.append("")
        lines.append("documented differences:")
        by_id = {d.id: d for d in DOCUMENTED}
        for did, its in documented.items():
            lines.append(f"- {did} ({len(its)} item{'s' if len(its) > 1 else ''}): {by_id[did].why}")
    unused = rep.unused_documented()
    if unused:
        lines.append("")
        lines.append("documented differences that no item showed (fixed, or not exercised): " + ", ".join(unused))
    return "\n".join(lines) + "\n"


def summary(rep: Report) -> dict:
    """The figures and the differences, as JSON-able data."""
    return {"counts": rep.counts(), "problems": rep.problems, "environment": rep.environment,
            "differences": [{"kind": i.kind, "case": i.case, "what": i.what, "documented": i.documented}
                            for i in rep.items if not i.same]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Command line: print the report; exit status 1 when a difference is unexplained."""
    ap = argparse.ArgumentParser(description="compare the conformance results of the two data planes")
    ap.add_argument("kernel")
    ap.add_argument("ebpf")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    ap.add_argument("--all", action="store_true", help="detail the documented differences too")
    ap.add_argument("--partial", action="store_true", help="compare only what the kernel side got to (a run cut short)")
    a = ap.parse_args(argv)
    kernel, ebpf = json.loads(Path(a.kernel).read_text()), json.loads(Path(a.ebpf).read_text())
    if a.partial:
        done = {c["name"] for c in kernel.get("cases", [])}
        ebpf["cases"] = [c for c in ebpf.get("cases", []) if c["name"] in done]
        if not kernel.get("probes"):
            ebpf.pop("probes", None)
    rep = compare(kernel, ebpf)
    print(json.dumps(summary(rep), indent=1) if a.json else format_report(rep, documented_details=a.all), end="")
    return 1 if rep.unexplained() or rep.problems else 0


if __name__ == "__main__":
    sys.exit(main())
