"""Configuration F1 (NetConfArena section III-D1): "precision over the agent's actual configuration
changes and recall over the reference configuration", reported next to the test-case score as a
contrast metric (text match alone does not say whether the intended behaviour is realised).

Both sides are normalised configuration deltas between the scenario baseline and a final state,
taken from full device captures (substrate.devstate) of the routers -- the devices the agent can
change through any ANI; customer-side setup on hosts is no one's delta:

- FRR: each daemon's own running configuration, as ``frr DAEMON: STANZA`` and
  ``frr DAEMON: STANZA | LINE`` items (FRR prints what it holds in one canonical form, so two
  spellings of one command are one item);
- kernel objects, in canonical ``ip`` argument form: ``addr``, ``route4``/``route6`` (service
  and agent routes: seg6local SIDs and their behaviours included; routes the kernel derives and
  routes FRR installs are consequences, not configuration), ``rule4``/``rule6``;
- nftables: ``nft TABLE/CHAIN: RULE`` per rule and ``nft TABLE/CHAIN`` per chain (counters
  normalised away).

A delta is the set of ``+ NODE ITEM`` (in the final state, not at baseline) and ``- NODE ITEM``.
precision = |agent ∩ reference| / |agent|, recall = |agent ∩ reference| / |reference|, F1 their
harmonic mean; both deltas empty count as 1.0, one of them empty as 0.0.

What it can tell: how much of the agent's change is the reference's (precision: extra changes,
detours, leftovers lower it) and how much of the reference's the agent made (recall). What it
cannot: whether the network behaves as asked (an equivalent configuration written another way --
another SID function, another table id, a route-map sequence -- scores low while passing every
test case; the test-case score is the correctness metric), nor anything about damage outside the
routers' configuration (the damage checks say that).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from substrate.devstate import FRR_NOISE, DeviceState, normalize_nft

if TYPE_CHECKING:
    from substrate.lab import Lab

#: FRR lines that are not configuration an operator changes (banners, version).
_FRR_SKIP_PREFIXES = ("frr version", "frr defaults", "Building configuration", "Current configuration")


def frr_items(daemon: str, text: str) -> set[str]:
    """The ``frr DAEMON: ...`` items of one daemon's running configuration (module docstring)."""
    out: set[str] = set()
    head = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        s = line.strip()
        if not s or s in FRR_NOISE or s.startswith(_FRR_SKIP_PREFIXES):
            continue
        if not line.startswith(" "):
            head = s
            out.add(f"frr {daemon}: {head}")
        else:
            out.add(f"frr {daemon}: {head} | {s}")
    return out


def nft_items(text: str) -> set[str]:
    """``nft TABLE/CHAIN[: RULE]`` items of an ``nft list ruleset`` text."""
    out: set[str] = set()
    table = chain = ""
    for raw in normalize_nft(text).splitlines():
        s = raw.strip()
        if s.startswith("table "):
            table, chain = s[len("table "):].rstrip(" {"), ""
        elif s.startswith("chain "):
            chain = s[len("chain "):].rstrip(" {")
            out.add(f"nft {table}/{chain}")
        elif s not in ("}", "") and chain:  # a rule, or the chain's type/policy line
            out.add(f"nft {table}/{chain}: {s}")
    return out


def config_items(state: DeviceState) -> set[str]:
    """The normalised configuration items of one node's state (module docstring)."""
    items: set[str] = set()
    for daemon, text in sorted((state.frr_daemons or {}).items()):
        items |= frr_items(daemon, text)
    items |= {f"addr {x}" for x in state.addresses}
    items |= {f"route6 {x}" for x in state.routes6} | {f"route4 {x}" for x in state.routes4}
    items |= {f"rule6 {x}" for x in state.rules6} | {f"rule4 {x}" for x in state.rules4}
    items |= nft_items(state.nft)
    return items


def config_delta(before: dict[str, DeviceState], after: dict[str, DeviceState]) -> set[str]:
    """``+ NODE ITEM`` / ``- NODE ITEM`` between two captures of the same nodes."""
    out: set[str] = set()
    for node in sorted(set(before) | set(after)):
        b = config_items(before[node]) if node in before else set()
        a = config_items(after[node]) if node in after else set()
        out |= {f"+ {node} {x}" for x in a - b} | {f"- {node} {x}" for x in b - a}
    return out


@dataclass(frozen=True)
class ConfigF1:
    """Precision, recall and F1 of an agent's delta against the reference delta."""

    precision: float
    recall: float
    f1: float
    agent_items: int
    reference_items: int
    common: int


def config_f1(agent: set[str], reference: set[str]) -> ConfigF1:
    """Configuration F1 of two deltas (module docstring for the empty cases)."""
    common = len(agent & reference)
    if not agent and not reference:
        return ConfigF1(1.0, 1.0, 1.0, 0, 0, 0)
    p = common / len(agent) if agent else 0.0
    r = common / len(reference) if reference else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return ConfigF1(p, r, f, len(agent), len(reference), common)


def capture_routers(lab: Lab) -> dict[str, DeviceState]:
    """Every router's state (kernel and each FRR daemon's configuration), in parallel."""
    from substrate.devstate import capture

    routers = lab.routers()
    return dict(zip(routers, lab.map(lambda n: capture(lab, n, frr="fast", sysctls="fast"), routers), strict=True))


def baseline_routers(lab: Lab) -> dict[str, DeviceState]:
    """The scenario baseline of every router (substrate.scenario.deploy.load_baseline)."""
    from substrate.scenario.deploy import load_baseline

    base = load_baseline(lab)
    return {n: base[n] for n in lab.routers() if n in base}


REFERENCE_DIR = "config-f1"


def reference_delta(lab: Lab, variant_key: str, apply: list[tuple[str, list[str]]],
                    setup: list[tuple[str, list[str]]]) -> set[str]:
    """The reference solution's delta on ``lab``: reset to the baseline, the customer-side
    ``setup`` steps (node, argv), the reference ``apply`` (node, shell lines, run out-of-band as
    the A0 reference writes them), then a capture of the routers. Cached in the lab's directory
    under ``variant_key`` (a digest of the variant): the first run of a variant pays one reset.
    Leaves the lab in the reference's state (every run resets first).

    Raises:
        SubstrateError: the reset failed. RuntimeError: a setup step or a reference command
            failed (nothing is cached; the run's config F1 is then not measured, and says why).
    """
    from substrate.scenario.deploy import reset

    cache = lab.dir / REFERENCE_DIR / f"{variant_key}.json"
    if cache.exists():
        return set(json.loads(cache.read_text()))
    reset(lab)
    for node, argv in setup:
        r = lab.exec(node, argv, timeout_s=10)  # as the run does it (harness.run)
        if not r.ok:  # without the customer side the reference's delta is not the task's
            raise RuntimeError(f"a setup step failed on {node}, so the reference delta cannot be measured: {r.summary()}")
    for node, lines in apply:
        r = lab.sh(node, "\n".join(["set -e", *lines]), timeout_s=60)
        if not r.ok:
            raise RuntimeError(f"the reference solution failed on {node}: {r.summary()}")
    try:
        lab.wait_converged(timeout_s=30)
    except Exception:  # noqa: BLE001 - configuration items do not depend on convergence
        pass
    delta = config_delta(baseline_routers(lab), capture_routers(lab))
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(sorted(delta), indent=0))
    return delta
