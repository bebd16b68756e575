"""``harness scenario``: build, inspect and describe brownfield scenarios."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from harness.cli.common import err, fail, friendly_errors, out

app = typer.Typer(help="Build brownfield scenarios from manifests (layered, seeded, with invariants).", no_args_is_help=True)


@app.command("build")
@friendly_errors
def build(
    manifest: Annotated[Path, typer.Option("--manifest", "-m", help="Manifest YAML.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Scenario file to write.")],
    seed: Annotated[int | None, typer.Option(min=0, help="Seed (default: the manifest's).")] = None,
    density: Annotated[int | None, typer.Option(min=1, help="State density, >= 1 (default: the manifest's).")] = None,
    verify: Annotated[bool, typer.Option(help="Deploy it once and refuse it unless every baseline invariant passes.")] = True,
) -> None:
    """Generate a scenario (same manifest + seed + density -> byte-identical file)."""
    from substrate.scenario import build as do_build
    from substrate.scenario import load_manifest

    if not output.parent.is_dir():
        fail(f"cannot write {output}: directory {output.parent} does not exist")
    m = load_manifest(manifest)
    sc = do_build(m, seed=seed, density=density)
    if verify:
        if os.geteuid() != 0:
            fail("verifying a scenario deploys it, which needs root; use --no-verify to skip "
                 "(harness lab up checks every invariant again)")
        from substrate.scenario.deploy import deploy_scenario

        t0 = time.monotonic()
        with err.status(f"verifying: deploying and checking {len(sc.invariants)} invariants..."):
            lab = deploy_scenario(sc, f"verify-{os.getpid()}")
            lab.destroy()
        err.print(f"verified: all {len(sc.invariants)} baseline invariants pass ({time.monotonic() - t0:.1f} s)", highlight=False)
    output.write_text(sc.to_json())
    kinds = Counter(i.kind for i in sc.invariants)
    from substrate.scenario.layers import intents

    counts = ", ".join(f"{len(it.instances(sc))} {it.name}" for it in intents() if not it.read_only)
    out.print(
        f"wrote {output}: {len(sc.topology.routers)} routers, {len(sc.topology.hosts)} hosts, "
        f"{counts}; {len(sc.invariants)} invariants "
        f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})",
        highlight=False,
    )


def _cell(v: object) -> str:
    """A table cell as plain text (never rich markup: values are scenario data)."""
    from rich.text import Text

    return Text(" ".join(map(str, v)) if isinstance(v, list) else ("" if v is None else str(v)))  # type: ignore[return-value]


@app.command("show")
@friendly_errors
def show(scenario: Annotated[Path, typer.Argument(help="Scenario file, or a manifest (built in memory, not deployed).")]) -> None:
    """Summarise a scenario: tenants, sites per PE, services, invariants."""
    from pydantic import ValidationError

    from substrate.scenario import Scenario
    from substrate.scenario import build as do_build
    from substrate.scenario import load_manifest
    from substrate.scenario.layers import intents

    try:
        sc = Scenario.load(str(scenario))
    except ValidationError:
        if scenario.suffix not in (".yaml", ".yml"):
            raise
        # a new user's first guess: a manifest (e.g. manifests/srv6-brownfield.yaml), not a built scenario
        m = load_manifest(scenario)
        sc = do_build(m)
        out.print(f"built from manifest {scenario} (seed {m.seed}, density {m.density}; not deployed)", highlight=False)
    out.print(f"layers: {', '.join(sc.layers)}", highlight=False)
    for it in intents():
        if it.read_only:
            continue
        rows = [it.summary(x) for x in it.instances(sc)]
        if not rows:
            out.print(f"{it.name}: none", highlight=False)
            continue
        t = Table(*rows[0], title=f"{it.name} ({len(rows)})", title_justify="left")
        for r in rows:
            t.add_row(*(_cell(v) for v in r.values()))
        out.print(t)
    out.print(f"spare circuits: {', '.join(f'{s.pe}:{s.pe_if}-{s.ce}' for s in sc.spares) or 'none'}", highlight=False)
    kinds = Counter(i.kind for i in sc.invariants)
    out.print(f"{len(sc.invariants)} invariants: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))


@app.command("schema")
@friendly_errors
def schema() -> None:
    """Print the JSON Schema of manifests (every layer's parameters included)."""
    from substrate.scenario.manifest import manifest_json_schema

    print(json.dumps(manifest_json_schema(), indent=2))
