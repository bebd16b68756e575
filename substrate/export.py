"""Export a topology as a Containerlab lab (topology file + per-router FRR files).

Layout written (as in Containerlab's own ``lab-examples/frr01``)::

    OUT/<name>.clab.yml
    OUT/<router>/frr.conf      integrated FRR configuration (same text the netns backend uses)
    OUT/<router>/daemons       FRR daemons file (zebra, staticd, isisd on)

Routers are ``kind: linux`` nodes of the official FRR image with ``/etc/frr/daemons`` and
``/etc/frr/frr.conf`` bound in; hosts are ``kind: linux`` nodes of a tools image. The SRv6 data
plane that FRR 8.4 cannot program (the ``sr0`` device and the locator's ``seg6local End`` route,
see shared/notes/substrate.md) goes into each node's ``exec`` list, the node sysctls into
``sysctls``. Links are ``endpoints: ["a:ethX", "b:ethY"]``; ``eth0`` stays Containerlab's
management interface, which is why the topology never uses it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from substrate import addressing as addr
from substrate import frr
from substrate.topology import Role, Topology

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
        if n.is_router and n.node_id is not None:
            files[f"{n.name}/frr.conf"] = frr.render_router(topo, n.name, frr_extra.get(n.name))
            files[f"{n.name}/daemons"] = "".join(
                f"{d}={'yes' if d in frr.BASE_DAEMONS else 'no'}\n" for d in frr.KNOWN_DAEMONS
            ) + 'vtysh_enable=yes\nzebra_options=" -A 127.0.0.1 -s 90000000"\n'
            loc = addr.locator(n.node_id)
            nodes[n.name] = {
                "group": "routers",
                "labels": {"anibench.role": n.role.value},
                "binds": [f"{n.name}/daemons:/etc/frr/daemons", f"{n.name}/frr.conf:/etc/frr/frr.conf"],
                "sysctls": dict(ROUTER_SYSCTLS),
                "exec": [
                    "ip link add sr0 type bridge",
                    "ip link set sr0 up",
                    f"ip -6 route add {loc} encap seg6local action End flavors next-csid "
                    f"lblen {addr.BLOCK_LEN} nflen {addr.CSID_LEN} count dev sr0 metric 1",
                ],
            }
            if n.name in services:
                cmds, sysctls, binds = service_exec(n.name, services[n.name], files)
                nodes[n.name]["exec"] += cmds
                nodes[n.name]["sysctls"].update(sysctls)
                nodes[n.name]["binds"] += binds
        else:
            cmds = []
            for i, (ifname, address, gw) in enumerate(frr.host_link_addresses(topo, n.name)):
                cmds += [f"ip link set {ifname} up", f"ip -6 addr add {address} dev {ifname}"]
                if i == 0:
                    cmds.append(f"ip -6 route add default via {gw} dev {ifname}")
            node: dict[str, Any] = {"group": "hosts", "labels": {"anibench.role": Role.HOST.value}, "sysctls": dict(HOST_SYSCTLS)}
            if n.name in services:
                more, sysctls, binds = service_exec(n.name, services[n.name], files)
                cmds += more
                node["sysctls"].update(sysctls)
                if binds:
                    node["binds"] = binds
            if cmds:
                node["exec"] = cmds
            nodes[n.name] = node
    doc = {
        "name": name,
        "topology": {
            "groups": {
                "routers": {"kind": "linux", "image": frr_image},
                "hosts": {"kind": "linux", "image": host_image},
            },
            "nodes": nodes,
            "links": [{"endpoints": [str(lk.a), str(lk.b)]} for lk in topo.links],
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
