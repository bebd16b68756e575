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

import re
from typing import TYPE_CHECKING

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

VTYSH_CONF = "service integrated-vtysh-config\n"


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
