"""``harness lab``: deploy, inspect, use and remove labs."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from harness.cli.common import DataplaneOption, err, fail, friendly_errors, out, use_dataplane

app = typer.Typer(help="Deploy and manage labs (real FRR routers in Linux namespaces).", no_args_is_help=True)

TopologyOpt = Annotated[
    str, typer.Option("--topology", "-t", help="line:N, ring:N, grid:RxC (optionally :nohosts), a YAML topology or a "
                                               "Containerlab file (*.clab.yml).")
]


def _load_topology(spec: str):  # noqa: ANN202 - a Topology
    """The topology of a spec, Containerlab files included; their notes go to stderr."""
    from substrate.clab import from_spec

    imported = from_spec(spec)
    for note in imported.notes:
        err.print(f"note: {note}", highlight=False, style="dim", soft_wrap=True)
    return imported


@app.command("up")
@friendly_errors
def up(
    name: Annotated[str, typer.Option("--name", "-n", help="Lab name (unique on this machine).")],
    topology: Annotated[
        str | None, typer.Option("--topology", "-t", help="line:N, ring:N, grid:RxC (optionally :nohosts), a YAML topology or a "
                                      "Containerlab file (*.clab.yml); default without --scenario: grid:5x5 (25 routers).")
    ] = None,
    scenario: Annotated[
        Path | None, typer.Option("--scenario", help="Scenario file (harness scenario build) to deploy instead of a bare topology.")
    ] = None,
    foreground: Annotated[
        bool, typer.Option("--foreground", help="Stay attached; destroy the lab on Ctrl-C or SIGTERM.")
    ] = False,
    timeout: Annotated[
        float | None, typer.Option(min=1, help="Bound on the wait for convergence, seconds (default 60; 120 when routers "
                                                "run their own configuration, e.g. an imported Containerlab lab).")
    ] = None,
    dataplane: DataplaneOption = None,
) -> None:
    """Deploy a lab and return once it has converged: IS-IS (every router has every loopback and
    locator), or for routers with their own configuration (a Containerlab lab) every IGP adjacency."""
    from substrate import Lab

    use_dataplane(dataplane)
    if scenario is not None and topology is not None:
        fail("give --topology or --scenario, not both (a scenario brings its own topology)", code=2)
    if scenario is None and topology is None:
        err.print("note: no --topology or --scenario given: deploying the default grid:5x5 (25 routers)", highlight=False)
    topology = topology or "grid:5x5"

    t0 = time.monotonic()
    with err.status("deploying...") as status:
        say = lambda m: status.update(f"{m}...")  # noqa: E731
        if scenario is not None:
            from substrate.scenario.deploy import deploy_scenario

            lab = deploy_scenario(scenario, name, detached=not foreground, progress=say)
        else:
            imported = _load_topology(topology)
            lab = Lab.create(imported.topology, name, detached=not foreground, converge_timeout_s=timeout, progress=say)
            if imported.source is not None:
                lab.save_meta(clab_file=str(imported.source.resolve()))
    routers, hosts = len(lab.routers()), len(lab.topology.hosts)
    own = any(n.self_configured for n in lab.topology.routers)
    waited = "no IGP to wait for" if not routers else "IGP adjacencies up" if own else "IS-IS converged"
    out.print(
        f"lab [bold]{lab.name}[/] up: {routers} routers, {hosts} hosts, {waited}, {time.monotonic() - t0:.1f} s",
        highlight=False,
    )
    if lab.record.features:
        err.print(lab.record.features, highlight=False, style="dim")
    if foreground:
        from substrate.signals import terminate_gracefully

        out.print("Ctrl-C to destroy it.")
        with lab, terminate_gracefully():
            import threading

            threading.Event().wait()


@app.command("down")
@friendly_errors
def down(name: Annotated[str, typer.Argument(help="Lab name.")]) -> None:
    """Destroy a lab: its processes, namespaces, links and runtime files."""
    from substrate import Lab

    t0 = time.monotonic()
    Lab.attach(name).destroy()
    out.print(f"lab {name} destroyed in {time.monotonic() - t0:.2f} s", highlight=False)


@app.command("ls")
@friendly_errors
def ls() -> None:
    """List the labs on this machine."""
    from substrate import Lab

    records = Lab.list()
    if not records:
        out.print("no labs")
        return
    table = Table("name", "status", "backend", "topology", "routers", "hosts", "created")
    for r in records:
        table.add_row(
            r.name, Lab(r).condition_text(), r.backend, r.topology.name, str(len(r.topology.routers)), str(len(r.topology.hosts)),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.created_at)),
        )
    out.print(table)


@app.command("show")
@friendly_errors
def show(name: Annotated[str, typer.Argument(help="Lab name.")]) -> None:
    """List a lab's nodes with roles and interfaces."""
    from substrate import Lab

    lab = Lab.attach(name)
    topo = lab.topology
    imported = any(n.source is not None for n in topo.nodes)
    table = Table("node", *(["name in file"] if imported else []), "role", "node id", "FRR", "interfaces")
    for info in lab.nodes():
        n = topo.node(info.name)
        renamed = n.source.interfaces if n.source else {}
        ifaces = " ".join(f"{i} ({renamed[i]})" if i in renamed else i for i in info.interfaces)
        if n.is_router and n.self_configured:
            frr_col = "own config: " + " ".join(d for d in n.frr_daemons if d not in ("zebra", "staticd"))
        else:
            frr_col = "underlay" if n.is_router else ""
        row = [escape(n.name), *([escape(n.source.name) if n.source else ""] if imported else []), n.role.value,
               "" if info.node_id is None or n.self_configured else str(info.node_id), escape(frr_col), escape(ifaces)]
        table.add_row(*row)
    out.print(table)
    if lab.record.meta.get("clab_file"):
        out.print(f"imported from {lab.record.meta['clab_file']}", highlight=False)


@app.command("netconf")
@friendly_errors
def netconf_(
    name: Annotated[str, typer.Argument(help="Lab name.")],
    device: Annotated[str | None, typer.Argument(help="Router (default: every router).")] = None,
) -> None:
    """How to reach the routers' NETCONF servers (starts the lab's NETCONF server if needed):
    host, port, user and key, for ncclient or any NETCONF client."""
    from substrate import Lab
    from substrate.lab import require_up
    from substrate.netconf import ensure_server

    eps = ensure_server(require_up(Lab.attach(name)))
    if device is not None and device not in eps:
        fail(f"{device!r} has no NETCONF server; routers: {', '.join(eps)}")
    table = Table("device", "host", "port", "user", "key")
    for d, ep in eps.items():
        if device is None or d == device:
            table.add_row(d, ep.host, str(ep.port), ep.user, ep.key_file)
    out.print(table)
    ep = eps[device or next(iter(eps))]
    out.print(f"ssh -p {ep.port} -i {ep.key_file} {ep.user}@{ep.host} -s netconf    # host key: {ep.host_key.split()[1][:24]}...",
              highlight=False, soft_wrap=True)
    out.print(f"python: ncclient.manager.connect(host='{ep.host}', port={ep.port}, username='{ep.user}', "
              f"key_filename='{ep.key_file}', hostkey_verify=False, look_for_keys=False, allow_agent=False)",
              highlight=False, soft_wrap=True)


@app.command(
    "exec",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
@friendly_errors
def exec_(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Lab name.")],
    node: Annotated[str, typer.Argument(help="Node name.")],
    timeout: Annotated[float, typer.Option(min=0.1, help="Deadline, seconds (exit 124 when reached).")] = 30.0,
    stdin: Annotated[bool, typer.Option("--stdin", "-i", help="Pass standard input to the command (as docker exec -i).")] = False,
) -> None:
    """Run a command inside a node: harness lab exec LAB NODE -- CMD [ARGS...]. Exits with its status."""
    from substrate import Lab

    argv = list(ctx.args)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        fail("no command given: harness lab exec LAB NODE -- CMD [ARGS...]", code=2)
    data = sys.stdin.buffer.read() if stdin else None
    r = Lab.attach(name).exec(node, argv, timeout_s=timeout, input=data)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.timed_out:
        err.print(f"timed out after {timeout:g} s", highlight=False)
    raise typer.Exit(r.returncode if r.returncode >= 0 else 128 - r.returncode)


@app.command("export")
@friendly_errors
def export(
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory to write into.")],
    topology: TopologyOpt = "grid:5x5",
    lab: Annotated[str | None, typer.Option("--lab", help="Export a deployed lab's topology instead.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Name in the Containerlab file.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="Export format.")] = "containerlab",
    frr_image: Annotated[str | None, typer.Option(help="FRR container image (default: the upstream 10.5.1).")] = None,
) -> None:
    """Write the topology as a Containerlab lab (topology file + frr.conf/daemons per router)."""
    from substrate import Lab
    from substrate.export import write_containerlab

    if fmt != "containerlab":
        fail(f"unknown export format {fmt!r}; available: containerlab", code=2)
    services = None
    if lab is not None:
        handle = Lab.attach(lab)
        topo, label = handle.topology, name or handle.name
        if (handle.dir / "scenario.json").exists():
            from substrate.scenario.deploy import load_scenario

            services = load_scenario(handle).node_config
    else:
        topo = _load_topology(topology).topology
        label = name or topo.name.replace(":", "-")
    kw = {"frr_image": frr_image} if frr_image else {}
    path = write_containerlab(topo, label, output, services=services, **kw)
    out.print(f"wrote {path}" + (" (with the scenario's services)" if services else ""), highlight=False)


@app.command("import")
@friendly_errors
def import_(
    file: Annotated[Path, typer.Argument(help="A Containerlab topology file (*.clab.yml).")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the topology (YAML) here; default: stdout.")] = None,
) -> None:
    """Translate a Containerlab topology file to anibench's topology YAML (what lab up deploys from it)."""
    from substrate.clab import load

    imported = load(file)
    for note in imported.notes:
        err.print(f"note: {note}", highlight=False, style="dim", soft_wrap=True)
    text = imported.topology.to_yaml()
    topo = imported.topology
    summary = (f"{topo.name}: {len(topo.routers)} routers, {len(topo.hosts)} hosts, {len(topo.links)} links")
    if output is None:
        sys.stdout.write(text)
        err.print(summary, highlight=False)
    else:
        output.write_text(text)
        out.print(f"wrote {output} ({summary}); deploy it with: harness lab up --topology {output} --name NAME", highlight=False)


@app.command("cleanup")
@friendly_errors
def cleanup(
    all_labs: Annotated[bool, typer.Option("--all", help="Also remove running labs, not only leftovers.")] = False,
    prefix: Annotated[str, typer.Option(
        "--prefix", help="Only labs whose name starts with PREFIX, with their namespaces and cgroups (on a shared "
        "machine: your own leftovers). Default: every lab.")] = "",
) -> None:
    """Remove what crashed labs left behind (anibench's namespaces, processes, run dirs only)."""
    from substrate import cleanup as do_cleanup
    from substrate.features import check_root_and_tools

    check_root_and_tools(need_frr=False)
    rep = do_cleanup(all_labs=all_labs, prefix=prefix)
    out.print(rep.summary(), highlight=False)


@app.command("check")
@friendly_errors
def check(
    name: Annotated[str, typer.Argument(help="Lab name (deployed from a scenario).")],
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write every verdict with its evidence here.")] = None,
    only_failed: Annotated[bool, typer.Option("--failed", help="List failed invariants only.")] = False,
) -> None:
    """Run the observer: pass/fail per baseline invariant, with evidence. Exits 1 if any fails."""
    from substrate import Lab
    from substrate.scenario.deploy import load_scenario
    from substrate.scenario.observer import observe

    lab = Lab.attach(name)
    sc = load_scenario(lab)
    t0 = time.monotonic()
    verdicts = observe(lab, sc.invariants)
    took = time.monotonic() - t0
    table = Table("invariant", "ok", "detail", "evidence")
    for v in verdicts:
        if only_failed and v.ok:
            continue
        ev = v.evidence[0] if v.evidence else None
        table.add_row(escape(v.id), "[green]pass[/]" if v.ok else "[red]FAIL[/]", escape(v.detail),
                      escape(f"{ev.node}$ {ev.command} (exit {ev.exit_code})") if ev else "")
    out.print(table)
    failed = [v for v in verdicts if not v.ok]
    out.print(f"{len(verdicts) - len(failed)}/{len(verdicts)} invariants pass ({took:.1f} s)", highlight=False)
    if json_out:
        json_out.write_text(json.dumps([v.model_dump() for v in verdicts], indent=1))
    if failed:
        raise typer.Exit(1)


@app.command("reset")
@friendly_errors
def reset(name: Annotated[str, typer.Argument(help="Lab name (deployed from a scenario).")]) -> None:
    """Put a scenario lab back to its baseline without redeploying (only what differs is touched), and
    verify that every node's full state equals its baseline (exit status 1 when one does not). A lab
    without a scenario (a Containerlab import, a bare topology) has no baseline: refused, unchanged."""
    from substrate import Lab
    from substrate.scenario.deploy import reset as do_reset

    rep = do_reset(Lab.attach(name))
    out.print(f"reset {name} in {rep.seconds:.2f} s: {rep.summary()}", highlight=False)
    if rep.residual:
        for node, lines in rep.residual.items():
            err.print(f"{node}: not restored: {'; '.join(lines)[:500]}", highlight=False)
        raise typer.Exit(1)
