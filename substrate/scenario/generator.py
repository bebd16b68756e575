"""Scenario generation: manifest + seed (+ density) -> Scenario, deterministically.

One ``random.Random(seed)`` is threaded through the layers in manifest order, and every choice
iterates in a fixed order, so the same inputs give a byte-identical scenario file
(``Scenario.to_json``). Rendering and invariants are recomputed from the inventory by the same
functions A3-T uses after an intent changes it.
"""

from __future__ import annotations

import random

from substrate.errors import TopologyError
from substrate.scenario.layers import get_layer
from substrate.scenario.layers.base import GenerationError
from substrate.scenario.manifest import Manifest, ManifestError
from substrate.scenario.model import Invariant, NodeConfig, Scenario
from substrate.topology import Role, Topology


def _dedupe(items: list[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in items if not (x in seen or seen.add(x))]  # type: ignore[func-returns-value]


def render_scenario(sc: Scenario) -> dict[str, NodeConfig]:
    """Device state of every service instance, per node (sorted by node; duplicates removed)."""
    out: dict[str, NodeConfig] = {}
    for name in sc.layers:
        get_layer(name).render(sc, out)
    result = {}
    for node in sorted(out):
        cfg = out[node]
        for field in ("links_up", "addresses", "rules6", "rules4", "routes6", "routes4", "frr"):
            setattr(cfg, field, _dedupe(getattr(cfg, field)))
        result[node] = cfg
    return result


#: The MTU of every lab link (substrate.backends: veth pairs at the kernel's default).
PORT_MTU = 1500


def device_invariants(sc: Scenario) -> list[Invariant]:
    """State invariants of each provider router as a whole, whatever the classes render on it
    (service ``device/<node>``):

    - ``nft_tables`` (id ``device/<node>/nft_tables``) -- the node holds exactly the nftables
      tables the scenario renders there (``sc.node_config``), none elsewhere. Issue 19: each class
      checks its own tables where it renders them, so a NAT table on a PE that is not the border,
      or a table under another name, failed no check;
    - ``policy_rules`` (``device/<node>/rules/<6|4>``) -- exactly the rendered policy rules plus
      the kernel's defaults (issue 36);
    - ``local_sids`` (``device/<node>/sids``) -- exactly the rendered local SID behaviours (the
      ``/64`` seg6local routes: action and parameters, as a multiset; which free function serves
      one is the operator's choice) (issue 36);
    - ``port_state`` (``device/<node>/ports``, PEs) -- each customer-facing port (sites', the
      external segment's) has the links' MTU and the root qdisc rendered there (issue 36)."""
    out: list[Invariant] = []
    for n in sc.topology.routers:
        if n.role not in (Role.P, Role.PE):
            continue
        cfg = sc.node_config.get(n.name)
        tables = sorted(cfg.nft) if cfg else []
        out.append(Invariant(
            id=f"device/{n.name}/nft_tables", kind="nft_tables", service=f"device/{n.name}",
            params={"node": n.name, "tables": tables},
            description=f"{n.name} holds exactly the nftables tables rendered there: " + (", ".join(tables) or "none"),
        ))
        # issue 36 (adversarial findings A1, A2): a policy rule or a SID no service renders (a
        # tenant's port leaked into another table, a backdoor End.DT6 into a tenant's table)
        # broke no probe. A task whose change alters them counts them as its own
        # (harness.tasks.split_checks: re-rendered state)
        for fam in (6, 4):
            rules = list(getattr(cfg, f"rules{fam}")) if cfg else []
            out.append(Invariant(
                id=f"device/{n.name}/rules/{fam}", kind="policy_rules", service=f"device/{n.name}",
                params={"node": n.name, "family": fam, "rules": rules},
                description=f"{n.name} holds exactly the IPv{fam} policy rules rendered there ({len(rules)}) and the kernel's defaults",
            ))
        ports = sorted({x.pe_if for x in sc.all_sites() if x.pe == n.name}
                       | ({sc.external.pe_if} if sc.external and sc.external.border_pe == n.name else set()))
        if ports:
            # issue 36 (adversarial findings A5, A6): a shaper or a lowered MTU on a customer-facing
            # port passed every probe (pings and TCP handshakes are small and few)
            want = {pt: {"mtu": PORT_MTU, "qdisc": (cfg.qdiscs.get(pt) if cfg else None) or "noqueue"} for pt in ports}
            out.append(Invariant(
                id=f"device/{n.name}/ports", kind="port_state", service=f"device/{n.name}",
                params={"node": n.name, "ports": want},
                description=f"{n.name}'s customer-facing ports {', '.join(ports)} have MTU {PORT_MTU} and the root qdisc rendered "
                            "(a rate limit's shaper, else the device's default)",
            ))
        sids = [x for x in (cfg.routes6 if cfg else []) if "seg6local" in x.split()]
        out.append(Invariant(
            id=f"device/{n.name}/sids", kind="local_sids", service=f"device/{n.name}",
            params={"node": n.name, "sids": sids},
            description=f"{n.name} binds exactly the local SID behaviours rendered there ({len(sids)}), whatever functions serve them",
        ))
    return out


def scenario_invariants(sc: Scenario) -> list[Invariant]:
    """Baseline invariants of every layer's instances, in layer order, then each router's own
    (:func:`device_invariants`).

    Raises:
        GenerationError: two invariants share an id (a layer bug).
    """
    out: list[Invariant] = []
    for name in sc.layers:
        out += get_layer(name).invariants(sc)
    out += device_invariants(sc)
    ids = [i.id for i in out]
    if len(ids) != len(set(ids)):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise GenerationError("invariants", f"duplicate invariant ids: {', '.join(dup[:5])}")
    return out


def build(manifest: Manifest, *, seed: int | None = None, density: int | None = None) -> Scenario:
    """Generate the scenario of ``manifest`` (seed and density default to the manifest's).

    Raises:
        ManifestError: the topology spec is bad, or a layer cannot generate what is asked (the
            message names the manifest field, e.g. a density that does not fit the pools).
    """
    seed = manifest.seed if seed is None else seed
    if density is not None and density < 1:  # given by the caller (--density): not the manifest's line
        raise ManifestError(f"density must be >= 1, got {density}", source="--density")
    density = manifest.density if density is None else density
    if density < 1:
        raise manifest.error(f"density must be >= 1, got {density}", "density")
    try:
        topo = Topology.from_spec(manifest.topology)
    except TopologyError as e:
        raise manifest.error(str(e), "topology") from None
    sc = Scenario(name=manifest.name, manifest_digest=manifest.digest(), seed=seed, density=density,
                  layers=[spec.name for spec in manifest.layers], topology=topo)
    rng = random.Random(seed)
    try:
        for spec in manifest.layers:
            layer = get_layer(spec.name)
            sc = layer.generate(sc, layer.Params.model_validate(spec.params), rng, density)
        sc.node_config = render_scenario(sc)
        sc.invariants = scenario_invariants(sc)
    except GenerationError as e:
        raise manifest.error(str(e).split(": ", 1)[-1], e.field) from None
    return sc
