"""FRR configuration of the underlay and the commands that run FRR in a node.

Underlay (issue 2, shared/notes/substrate.md): IS-IS level-2 only, wide metrics (needed for IPv6
prefixes in LSPs in FRR 8.4), point-to-point core links with 1 s hellos, and fast LSP/SPF timers
placed *before* ``net`` under ``router isis`` (else the first LSP regeneration waits ~30 s).
Each router advertises its loopback, its SRv6 locator (connected /48 of the passive ``sr0``
interface) and its base-host links, all passive.

Daemons are started the way Debian's ``frrinit.sh`` does in integrated-config mode: each daemon
with ``-d`` and no per-daemon file, then ``vtysh -b`` pushes ``/etc/frr/frr.conf`` to all of them.
Inside a node, ``/etc/frr`` and ``/var/run/frr`` are the node's own (mount namespace), so default
paths work and ``vtysh`` needs no ``-N``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from substrate import addressing as addr
from substrate.frr_daemons import ALWAYS_ON, BASE_DAEMONS, KNOWN_DAEMONS
from substrate.topology import Node, Role, Topology

if TYPE_CHECKING:
    from substrate.process import ExecResult

__all__ = ["ALWAYS_ON", "BASE_DAEMONS", "KNOWN_DAEMONS"]  # and the functions below

#: Name of the IS-IS instance (area tag) on every router.
ISIS_TAG = "CORE"
DAEMON_DIR = "/usr/lib/frr"
#: Hello interval (s) and multiplier on core links: hold time 3 s.
HELLO_INTERVAL = 1
HELLO_MULTIPLIER = 3

#: vtysh's own configuration in every router: integrated frr.conf, and root (the only user of a
#: node) admitted without PAM, which needs host files a node does not get (/etc/pam.d; FRR's
#: vtysh.conf ``username USER nopassword``).
VTYSH_CONF = "service integrated-vtysh-config\nusername root nopassword\n"
#: The IS-IS neighbour command whose structured answer :func:`parse_isis_neighbors` reads.
ISIS_NEIGHBOR_JSON = "show isis neighbor json"


@dataclass(frozen=True)
class IsisAdjacency:
    """One IS-IS adjacency as FRR reports it."""

    neighbor: str  #: the neighbour's dynamic hostname (node name), or its system id without one
    interface: str
    level: int
    state: str  #: Up, Initializing, Down


def parse_isis_neighbors(text: str) -> list[IsisAdjacency]:
    """The adjacencies in FRR's ``show isis neighbor json`` answer.

    FRR 8.4 answers ``{"areas": [{"area": TAG, "circuits": [{"adj": HOST, "interface": IF,
    "level": N, "state": "Up", ...}, {"circuit": 0}, ...]}]}`` (a passive circuit is an object
    without ``adj``). Structured output, because the text table prints the system id, interface
    and level columns with fixed widths that names of 10 characters or more run together
    (``ethernetlong012  Up``: issue 17). Any object carrying an interface and a state is read,
    wherever it sits, so a later FRR that nests the list differently is read too.

    Raises:
        ValueError: ``text`` is not JSON (the daemon answered with an error).
    """
    out: list[IsisAdjacency] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if "interface" in x and "state" in x and ("adj" in x or "system-id" in x):
                level = x.get("level", 0)
                out.append(IsisAdjacency(neighbor=str(x.get("adj") or x.get("system-id")), interface=str(x["interface"]),
                                         level=int(level) if str(level).isdigit() else 0, state=str(x["state"])))
                return
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(json.loads(text) if text.strip() else {})
    return out


#: Commands :func:`isis_settled` reads from isisd's vty.
ISIS_SUMMARY_JSON = "show isis summary json"
ISIS_DATABASE = "show isis database"
_LSP_ROW = re.compile(r"^\s*(\S+?)\s*(\*)?\s+(\d+)\s+(0x[0-9a-fA-F]+)\s+(0x[0-9a-fA-F]+)\s+(\d+)\s+(\d+/\d+/\d+)\s*$")


def parse_isis_database(text: str) -> dict[str, tuple[str, str]]:
    """``show isis database`` as {LSP ID: (sequence number, checksum)}.

    FRR 8.4's ``show isis database json`` is broken (every LSP overwrites the previous one under
    the same keys), so the text is read -- by a row pattern anchored on the numeric columns, which
    long names cannot shift: the LSP ID is the first word, with the own-LSP ``*`` glued to it or not.
    """
    out: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        m = _LSP_ROW.match(line)
        if m:
            out[m.group(1).rstrip("*")] = (m.group(4).lower(), m.group(5).lower())
    return out


def isis_spf_pending(summary_json: str) -> bool:
    """True when ``show isis summary json`` says an SPF run is scheduled at some level.

    Raises:
        ValueError: not JSON.
    """
    data = json.loads(summary_json)
    return any(str(lv.get("spf", "no pending")) != "no pending"
               for area in data.get("areas", []) for lv in area.get("levels", []) if isinstance(lv, dict))


def runs_only_installed_code(maps: str, environ: bytes) -> bool:
    """Whether a process runs only the code installed under /usr: no ``LD_*`` variable in its
    environment (``LD_PRELOAD``, ``LD_AUDIT``, ``LD_LIBRARY_PATH``, ... load code before ``main``)
    and no executable mapping but files under /usr and the kernel's vdso/vsyscall pages.

    A process with the name and program of an FRR daemon that fails this runs an agent's code
    inside the daemon (a library injected into ``/usr/lib/frr/staticd``, say) and must not be
    kept as the node's daemon: it would outlive the call, the run's end and ``lab reset``.

    Args:
        maps: ``/proc/PID/maps`` of the process. environ: ``/proc/PID/environ``.
    """
    if any(v.startswith(b"LD_") for v in environ.split(b"\0")):
        return False
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 2 or "x" not in fields[1]:
            continue
        path = fields[5].strip() if len(fields) > 5 else ""
        if not (path.startswith("/usr/") or path in ("[vdso]", "[vsyscall]")):
            return False
    return True


def daemon_argv(daemon: str) -> list[str]:
    """argv that starts one FRR daemon inside a node (daemonizes; vty on 127.0.0.1 only).

    Raises:
        ValueError: unknown daemon.
    """
    if daemon not in KNOWN_DAEMONS:
        raise ValueError(f"unknown FRR daemon {daemon!r}; known: {', '.join(KNOWN_DAEMONS)}")
    return [f"{DAEMON_DIR}/{daemon}", "-d", "-A", "127.0.0.1"]


def start_script(daemons: list[str] | tuple[str, ...]) -> str:
    """A bash script that starts ``daemons`` (zebra first) and then loads frr.conf with ``vtysh -b``.

    The daemons detach (``-d``); the script exits non-zero if any of them fails to start or the
    configuration cannot be applied.
    """
    ordered = [d for d in KNOWN_DAEMONS if d in daemons]
    lines = ["set -e"]
    lines += [" ".join(daemon_argv(d)) for d in ordered]
    # without an integrated frr.conf, each daemon has read its own <daemon>.conf at start (FRR's
    # vty_read_config skips that file when frr.conf exists), as frrinit.sh does
    lines.append("[ -e /etc/frr/frr.conf ] || exit 0")
    lines.append("vtysh -b >/tmp/vtysh-b.log 2>&1 || { cat /tmp/vtysh-b.log >&2; exit 1; }")
    return "\n".join(lines) + "\n"


def start_failure(node: Node, result: ExecResult) -> str:
    """One line saying why :func:`start_script` failed on ``node``: the configuration lines FRR
    refused (``vtysh -b`` names each by its line in frr.conf, and the file it came from when the
    node was imported), else the script's own summary."""
    refused = [ln.strip() for ln in result.stderr.splitlines() if re.match(r"\s*line \d+:", ln)]
    if not refused:
        return f"{node.name}: FRR failed to start: {result.summary()}"
    src = node.source.files.get("frr.conf") if node.source else None
    where = f"its frr.conf ({src})" if src else "its frr.conf"
    shown = "; ".join(re.sub(r"\[\d+\]", "", x) for x in refused[:3]) + (f"; {len(refused) - 3} more" if len(refused) > 3 else "")
    return f"{node.name}: FRR 8.4 refused {len(refused)} line(s) of {where}: {shown}; fix the configuration and deploy again"


def daemons_file(daemons: tuple[str, ...] | list[str]) -> str:
    """The ``/etc/frr/daemons`` file that runs ``daemons`` (one ``name=yes|no`` line per known
    daemon; zebra and staticd are always started by FRR and have no line)."""
    lines = [f"{d}={'yes' if d in daemons else 'no'}" for d in KNOWN_DAEMONS if d not in ALWAYS_ON]
    return "\n".join(lines) + '\nvtysh_enable=yes\nzebra_options=" -A 127.0.0.1 -s 90000000"\n'


def node_files(topo: Topology, router: str, extra: list[str] | None = None) -> dict[str, str]:
    """The files of a router's ``/etc/frr``, by name: ``frr.conf`` (rendered underlay, or the
    router's own configuration with ``extra`` appended), ``vtysh.conf``, ``daemons`` and any
    per-daemon file the router was given.

    Raises:
        KeyError: unknown node; ValueError: the node is a host.
    """
    node = topo.node(router)
    if not node.is_router:
        raise ValueError(f"{router} is not a router")
    files = {"vtysh.conf": VTYSH_CONF}
    if node.self_configured:
        files.update(node.frr_files)
        if extra and "frr.conf" in files:
            files["frr.conf"] = files["frr.conf"].rstrip("\n") + "\n" + "".join(b.rstrip("\n") + "\n!\n" for b in extra)
    else:
        files.update(node.frr_files)  # vtysh.conf at most (anything else makes it self-configured)
        files["frr.conf"] = render_router(topo, router, extra)
    files["daemons"] = daemons_file(node.frr_daemons)
    return files


def render_router(topo: Topology, router: str, extra: list[str] | None = None) -> str:
    """The integrated ``frr.conf`` of one router's underlay.

    Args:
        topo: the topology.
        router: a P or PE node name.
        extra: more configuration stanzas appended at the end (scenario layers), each a block of
            lines without the trailing ``!``.

    Returns:
        The configuration text, as FRR's ``show running-config`` would order it.

    Raises:
        KeyError: unknown node; ValueError: the node is a host.
    """
    node = topo.node(router)
    if not node.is_router or node.node_id is None:
        raise ValueError(f"{router} is not a router")
    nid = node.node_id
    out = [
        "frr defaults traditional",
        f"hostname {router}",
        "log file /var/log/frr/frr.log informational",
        "service integrated-vtysh-config",
        "!",
    ]
    host_k = 0
    for link in topo.links_of(router):
        ep = link.endpoint_of(router)
        peer = topo.node(link.peer_of(router).node)
        out.append(f"interface {ep.interface}")
        if peer.role is Role.HOST and peer.managed:
            out.append(f" description to CE {peer.name}")
        elif peer.role is Role.EXTERNAL:  # another AS: no IGP towards it (its service class addresses the port)
            out.append(f" description to external router {peer.name}")
        elif peer.role is Role.HOST:
            out.append(f" description to host {peer.name}")
            out.append(f" ipv6 address {addr.nth_host(addr.base_host_prefix(nid, host_k), 1)}")
            host_k += 1
            out += [f" ipv6 router isis {ISIS_TAG}", " isis passive"]
        else:
            out += [
                f" description to {peer.name}",
                f" ipv6 router isis {ISIS_TAG}",
                f" isis hello-interval {HELLO_INTERVAL}",
                f" isis hello-multiplier {HELLO_MULTIPLIER}",
                f" isis metric {link.metric}",
                " isis network point-to-point",
            ]
        out += ["exit", "!"]
    out += [
        "interface lo",
        f" ipv6 address {addr.loopback(nid)}",
        f" ipv6 router isis {ISIS_TAG}",
        " isis passive",
        "exit",
        "!",
        "interface sr0",
        " description SRv6 locator (End, NEXT-C-SID)",
        f" ipv6 address {addr.locator_address(nid)}",
        f" ipv6 router isis {ISIS_TAG}",
        " isis passive",
        "exit",
        "!",
        f"router isis {ISIS_TAG}",
        " is-type level-2-only",
        " metric-style wide",
        " lsp-gen-interval 1",
        " spf-interval 1",
        " log-adjacency-changes",
        f" net {addr.isis_net(nid)}",
        "exit",
        "!",
    ]
    for block in extra or []:
        out += [block.rstrip("\n"), "!"]
    out.append("end")
    return "\n".join(out) + "\n"


def host_link_addresses(topo: Topology, host: str) -> list[tuple[str, str, str]]:
    """Addresses of a base host: ``(interface, address/len, gateway)`` for each router link.

    The host's address is ``::2`` of the PE's host-link /64; its gateway is the PE's ``::1``.
    """
    out = []
    for link in topo.links_of(host):
        peer = topo.node(link.peer_of(host).node)
        if not peer.is_router or peer.node_id is None:
            continue
        bases = topo.base_hosts_of(peer.name)
        if host not in bases:
            continue
        k = bases.index(host)
        prefix = addr.base_host_prefix(peer.node_id, k)
        out.append((link.endpoint_of(host).interface, addr.nth_host(prefix, 2), str(prefix.network_address + 1)))
    return out


#: The integrated configuration file inside a node (its own /etc/frr): the startup configuration.
STARTUP_CONFIG = "/etc/frr/frr.conf"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _block_end(lines: list[str], i: int) -> int:
    """Index past line ``i`` and the lines nested under it (indented deeper), and past the
    ``exit``/``exit-address-family``/``exit-vrf`` at its own indentation that closes them."""
    n, stop = _indent(lines[i]), i + 1
    while stop < len(lines) and lines[stop].strip() and _indent(lines[stop]) > n:
        stop += 1
    if stop > i + 1 and stop < len(lines) and _indent(lines[stop]) == n and lines[stop].strip() in ("exit", "exit-address-family", "exit-vrf"):
        stop += 1
    return stop


def _drop_stanza(lines: list[str], i: int) -> list[str]:
    """``lines`` without the stanza at ``i``: its head, nested lines, ``exit`` and one ``!`` after."""
    stop = _block_end(lines, i)
    if stop == i + 1 and stop < len(lines) and lines[stop].strip() == "exit":
        stop += 1  # an empty stanza: its head, then its exit
    if stop < len(lines) and lines[stop].strip() == "!":
        stop += 1
    return lines[:i] + lines[stop:]


def edit_startup_config(text: str, changes: list[tuple[str, str, bool]]) -> str:
    """``text`` (an integrated ``frr.conf``) with each ``(stanza head, line, present)`` made true:
    a line is added at the end of its stanza (the stanza is added before ``end`` if missing) or
    removed from it; head "" is a top-level line. Idempotent; the rest of the file is kept as it
    is. What ``write memory`` would save for those lines, without saving anything else of the
    running configuration (nor losing the part of a daemon that is down, which ``write memory``
    does: vtysh writes only what the running daemons answer).

    A head may open several stanzas (a deployed file has a port's underlay stanza and, after it,
    its service stanza): a line is removed from each, and added to the first. A stanza a removal
    leaves without lines is removed whole (no empty head such as ``interface eth9`` / ``exit``
    is left behind); a top-level line that heads a stanza is removed with its nested lines."""
    lines = text.splitlines()

    def starts(head: str) -> list[int]:
        return [i for i, x in enumerate(lines) if x == head]

    def end_index() -> int:
        return next((i for i, x in enumerate(lines) if x.strip() == "end"), len(lines))

    for head, line, present in changes:
        if not head:
            idx = [i for i, x in enumerate(lines) if x.strip() == line and not x.startswith(" ")]
            if present and not idx:
                lines[end_index():end_index()] = [line]
            elif not present:
                for i in reversed(idx):
                    lines = _drop_stanza(lines, i) if _block_end(lines, i) > i + 1 or (
                        i + 1 < len(lines) and lines[i + 1].strip() == "exit") else lines[:i] + lines[i + 1:]
            continue
        found = starts(head)
        if not found:
            if present:
                e = end_index()
                lines[e:e] = [head, f" {line}", "exit", "!"]
            continue
        bodies = {s: [k for k in range(s + 1, _block_end(lines, s)) if lines[k].strip() == line and _indent(lines[k]) == 1]
                  for s in found}  # fmt: skip
        if present:
            if not any(bodies.values()):
                s = found[0]
                stop = s + 1  # the stanza's indented lines, up to its "exit" or the next top-level line
                while stop < len(lines) and lines[stop].startswith(" "):
                    stop += 1
                lines[stop:stop] = [f" {line}"]
            continue
        for s in reversed(found):  # from the end: earlier indices stay valid
            hit = bodies[s]
            if not hit:
                continue
            for k in reversed(hit):
                del lines[k:_block_end(lines, k) if _block_end(lines, k) > k + 1 else k + 1]
            if _block_end(lines, s) == s + 1:  # emptied by this removal: no empty head left behind
                lines = _drop_stanza(lines, s)
    return "\n".join(lines) + "\n"
