"""Export a topology as a Containerlab lab (topology file + per-router FRR files).

Layout written (as in Containerlab's own ``lab-examples/frr01``)::

    OUT/<name>.clab.yml
    OUT/<router>/frr.conf      integrated FRR configuration (same text the netns backend uses)
    OUT/<router>/daemons       FRR daemons file (the router's daemon set: isisd on the underlay)

Routers are ``kind: linux`` nodes of the official FRR image with ``/etc/frr/daemons`` and
``/etc/frr/frr.conf`` bound in; hosts are ``kind: linux`` nodes of a tools image. The SRv6 data
plane that FRR 8.4 cannot program (the ``sr0`` device and the locator's ``seg6local End`` route,
see shared/notes/substrate.md) goes into each node's ``exec`` list, the node sysctls into
``sysctls``. Links are ``endpoints: ["a:ethX", "b:ethY"]``; ``eth0`` stays Containerlab's
management interface, which is why the topology never uses it. A router with its own
configuration (an imported lab, :mod:`substrate.clab`) is written with its own files, daemon set
and exec commands; :func:`substrate.clab.load` reads any of these files back into the same model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from substrate import addressing as addr
from substrate import frr
from substrate.topology import Topology

#: Images of the export (overridable: ``harness lab export --frr-image``). Labs here run Debian's
#: FRR 8.4; the upstream 10.x image accepts the 8.4 configuration we render.
FRR_IMAGE = "quay.io/frrouting/frr:10.5.1"
HOST_IMAGE = "wbitt/network-multitool:3.22.2"

ROUTER_SYSCTLS = {
    "net.ipv6.conf.all.forwarding": 1,
    "net.ipv4.ip_forward": 1,
    "net.ipv6.conf.all.seg6_enabled": 1,
    "net.ipv6.conf.default.seg6_enabled": 1,
    "net.ipv6.conf.all.accept_dad": 0,
    "net.ipv6.conf.default.accept_dad": 0,
}
HOST_SYSCTLS = {"net.ipv6.conf.all.accept_dad": 0, "net.ipv6.conf.default.accept_dad": 0}


def service_exec(node: str, cfg: Any, files: dict[str, str]) -> tuple[list[str], dict[str, str], list[str]]:
    """A scenario node's service state (a NodeConfig) as Containerlab ``exec`` commands, sysctls
    and bound nftables files: (exec lines, sysctls, binds)."""
    cmds = [f"ip link set {i} up" for i in cfg.links_up] + [f"ip addr add {a}" for a in cfg.addresses]
    binds = []
    for table in sorted(cfg.nft):
        fname = f"{node}/nft-{table.replace(' ', '-')}.nft"
        files[fname] = cfg.nft[table]
        binds.append(f"{fname}:/etc/anibench/{table.replace(' ', '-')}.nft")
        cmds.append(f"nft -f /etc/anibench/{table.replace(' ', '-')}.nft")
    for fam in (6, 4):
        cmds += [f"ip -{fam} rule add {r}" for r in getattr(cfg, f"rules{fam}")]
        cmds += [f"ip -{fam} route add {r}" for r in getattr(cfg, f"routes{fam}")]
    sysctls = {k.replace("/", "."): v for k, v in cfg.sysctls.items()}
    return cmds, sysctls, binds


#: Labels that carry what the topology model knows and Containerlab does not (read back by
#: substrate.clab, so that export then import gives the same model).
LABEL_ROLE = "anibench.role"
LABEL_NODE_ID = "anibench.node-id"
LABEL_MANAGED = "anibench.managed"
#: Group label marking nodes this export wrote: their default set-up (underlay frr.conf, sr0,
#: base-host addresses, node sysctls) is recognised and dropped again on import.
LABEL_EXPORTED = "anibench.exported"
#: Link variable carrying an IS-IS metric other than the default.
METRIC_VAR = "anibench-metric"
DEFAULT_METRIC = 10


def default_exec(topo: Topology, name: str) -> list[str]:
    """The exec commands the export gives a node for the substrate's own set-up: an underlay
    router's ``sr0`` device and locator ``End`` route; a base host's addresses and default route;
    nothing for nodes that configure themselves."""
    n = topo.node(name)
    if n.is_router:
        if n.self_configured or n.node_id is None:
            return []
        return [
            "ip link add sr0 type bridge",
            "ip link set sr0 mtu 65535 up",
            f"ip -6 route add {addr.locator(n.node_id)} encap seg6local action End flavors next-csid "
            f"lblen {addr.BLOCK_LEN} nflen {addr.CSID_LEN} count dev sr0 metric 1",
        ]
    cmds = []
    for i, (ifname, address, gw) in enumerate(frr.host_link_addresses(topo, name)):
        cmds += [f"ip link set {ifname} up", f"ip -6 addr add {address} dev {ifname}"]
        if i == 0:
            cmds.append(f"ip -6 route add default via {gw} dev {ifname}")
    return cmds


def default_sysctls(topo: Topology, name: str) -> dict[str, int]:
    """The sysctls the export gives a node (what the netns node init sets itself)."""
    return dict(ROUTER_SYSCTLS if topo.node(name).is_router else HOST_SYSCTLS)


def to_containerlab(
    topo: Topology,
    name: str,
    *,
    frr_extra: dict[str, list[str]] | None = None,
    services: dict[str, Any] | None = None,
    frr_image: str = FRR_IMAGE,
    host_image: str = HOST_IMAGE,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Build the Containerlab topology document and the files it binds.

    Routers get their ``/etc/frr`` files (:func:`substrate.frr.node_files`: the rendered underlay
    or the router's own configuration, and the daemons file of its daemon set) as binds; every
    node gets :func:`default_exec` then its own ``exec`` commands, and its sysctls. Labels carry
    role, router number and the ``managed`` flag, a link variable a non-default metric
    (:data:`LABEL_ROLE`, ...), so that :func:`substrate.clab.load` gives the same model back.

    Args:
        topo: the topology.
        name: the lab name in the file.
        frr_extra: per router, extra FRR configuration blocks (appended to frr.conf).
        services: a scenario's rendered service state per node (``Scenario.node_config``): its
            FRR blocks go to frr.conf, the rest to ``exec``/``sysctls``/bound nftables files.

    Returns:
        ``(document, files)`` where ``files`` maps a path relative to the topology file to its
        content (``r1/frr.conf``, ``r1/daemons``, ...).
    """
    services = services or {}
    frr_extra = {**(frr_extra or {})}
    for node, cfg in services.items():
        if cfg.frr:
            frr_extra[node] = [*frr_extra.get(node, []), *cfg.frr]
    files: dict[str, str] = {}
    nodes: dict[str, Any] = {}
    for n in topo.nodes:
        labels: dict[str, Any] = {LABEL_ROLE: n.role.value}
        if n.node_id is not None:
            labels[LABEL_NODE_ID] = n.node_id
        if n.managed:
            labels[LABEL_MANAGED] = "true"
        node: dict[str, Any] = {"group": "routers" if n.is_router else "hosts", "labels": labels}
        binds: list[str] = []
        if n.is_router:
            node_files = frr.node_files(topo, n.name, frr_extra.get(n.name))
            shown = ["daemons", "frr.conf", *sorted(f for f in node_files if f not in ("daemons", "frr.conf"))]
            for fname in shown:
                if fname in node_files and (fname != "vtysh.conf" or "vtysh.conf" in n.frr_files):
                    files[f"{n.name}/{fname}"] = node_files[fname]
                    binds.append(f"{n.name}/{fname}:/etc/frr/{fname}")
        cmds = default_exec(topo, n.name) + list(n.exec)
        sysctls: dict[str, Any] = {**default_sysctls(topo, n.name), **n.sysctls}
        if n.name in services:
            more, more_sysctls, more_binds = service_exec(n.name, services[n.name], files)
            cmds += more
            sysctls.update(more_sysctls)
            binds += more_binds
        if binds:
            node["binds"] = binds
        node["sysctls"] = sysctls
        if cmds:
            node["exec"] = cmds
        nodes[n.name] = node
    links = []
    for lk in topo.links:
        entry: dict[str, Any] = {"endpoints": [str(lk.a), str(lk.b)]}
        if lk.metric != DEFAULT_METRIC:
            entry["vars"] = {METRIC_VAR: lk.metric}
        links.append(entry)
    doc = {
        "name": name,
        "topology": {
            "groups": {
                "routers": {"kind": "linux", "image": frr_image, "labels": {LABEL_EXPORTED: "true"}},
                "hosts": {"kind": "linux", "image": host_image, "labels": {LABEL_EXPORTED: "true"}},
            },
            "nodes": nodes,
            "links": links,
        },
    }
    return doc, files


def write_containerlab(topo: Topology, name: str, out_dir: str | Path, **kw: Any) -> Path:
    """Write the export under ``out_dir`` (created if needed). Returns the topology file's path."""
    out = Path(out_dir)
    doc, files = to_containerlab(topo, name, **kw)
    for rel, text in files.items():
        p = out / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    path = out / f"{name}.clab.yml"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=200))
    return path
