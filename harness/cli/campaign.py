"""``harness campaign`` and ``harness task``: the main job of the product."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperCommand

from harness.cli.common import DataplaneOption, err, fail, friendly_errors, out, use_dataplane

DEFAULT_MANIFEST = "manifests/srv6-brownfield.yaml"
#: The scenario the protocol templates are validated on (3x3 grid with every template family's state).
TEMPLATE_MANIFEST = "tests/data/templates-small.yaml"


def _csv(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


def _opts(values: list[str] | None) -> dict[str, str]:
    out_: dict[str, str] = {}
    for v in values or []:
        k, sep, val = v.partition("=")
        if not sep or not k:
            fail(f"--agent-opt expects KEY=VALUE, got {v!r}", code=2)
        out_[k] = val
    return out_


def task_manifest(template: bool, manifest: str | None, density: int | None) -> tuple[str, int]:
    """The manifest and density a task command builds its scenario from: what was given; when
    no ``--manifest`` was given, :data:`TEMPLATE_MANIFEST` for a protocol template (density 1
    unless ``--density``) and :data:`DEFAULT_MANIFEST` for a task class (density 2 unless given).
    An explicit ``--manifest`` is honoured even when it names the default manifest."""
    if manifest is None:
        return (TEMPLATE_MANIFEST, density or 1) if template else (DEFAULT_MANIFEST, density or 2)
    return manifest, density or 2


def _manifest_path(manifest: str) -> str:
    p = Path(manifest)
    if not p.exists():
        here = Path(__file__).resolve().parents[2] / manifest
        if here.exists():
            return str(here)
    return manifest


def task_help() -> str:
    """The help of ``harness campaign --task``: every registered task class
    (:data:`harness.tasks.TASK_CLASSES`, in registration order), so that it follows the registry."""
    from harness.tasks import TASK_CLASSES

    return f"Task class: {', '.join(TASK_CLASSES)}; or a protocol template (harness task list)."


class CampaignCommand(TyperCommand):
    """``harness campaign``, whose ``--task`` help is :func:`task_help`, filled in when the help
    is shown (importing the registry at start-up would cost every command half a second)."""

    def format_help(self, ctx, formatter) -> None:  # noqa: ANN001
        for p in self.params:
            if p.name == "task":
                p.help = task_help()
        super().format_help(ctx, formatter)


@friendly_errors
def campaign(
    ani: Annotated[str, typer.Option(help="ANI level(s), comma-separated, e.g. A0,A3-T; a level with an ablation "
                                     "is a setting of its own: A1,A1+blocklist.")] = "A0,A3-T",
    task: Annotated[str, typer.Option(help="Task class (harness task list).")] = "change-set",  # CampaignCommand
    variants: Annotated[int, typer.Option(min=1, help="Task variants (each replayed across the settings).")] = 6,
    agent: Annotated[str, typer.Option(help="Agent(s): scripted, noisy, openai, command.")] = "scripted",
    model: Annotated[str | None, typer.Option(help="Model(s) for model-driven agents, comma-separated.")] = None,
    mode: Annotated[str | None, typer.Option(
        help="Agent mode(s) of the openai agent, comma-separated: single-turn, react, planner-executor, each "
        "with recovery or as MODE-norecovery (default react).")] = None,
    faults: Annotated[float, typer.Option(min=0, max=1, help="Fault rate lambda, in faults per agent step.")] = 0.0,
    density: Annotated[int, typer.Option(min=1, help="State density of the brownfield.")] = 2,
    budget_steps: Annotated[int, typer.Option(min=1, help="Step budget per run (matched across settings).")] = 60,
    budget_tokens: Annotated[int | None, typer.Option(
        min=1, help="Token budget per run (prompt + completion), enforced by the agent adapter; a run that "
        "spends it ends as 'budget hit'.")] = None,
    manifest: Annotated[str, typer.Option(help="Scenario manifest.")] = DEFAULT_MANIFEST,
    seed: Annotated[int, typer.Option(min=0, help="Scenario seed of variant 0 (variant v: seed + v).")] = 7,
    wall_cap: Annotated[float, typer.Option(min=1, help="Wall-clock cap per run, seconds.")] = 600.0,
    agent_opt: Annotated[list[str] | None, typer.Option("--agent-opt", help="Agent option KEY=VALUE (repeatable).")] = None,
    campaign_id: Annotated[str | None, typer.Option("--id", help="Campaign id (default: derived from the options).")] = None,
    db: Annotated[Path, typer.Option(envvar="ANIBENCH_DB", help="Results database (SQLite).")] = Path("results/anibench.sqlite"),
    results: Annotated[Path, typer.Option(help="Directory for run files (trajectories, verdicts).")] = Path("results/runs"),
    resume: Annotated[bool, typer.Option(help="Continue an interrupted campaign (no run lost or repeated).")] = False,
    report: Annotated[bool, typer.Option(help="Print the report at the end.")] = True,
    executor: Annotated[str, typer.Option(help="Where the runs go: local (this machine, one variant after the other) "
                                          "or ray (variants spread over a Ray cluster; README 'Many machines').")] = "local",
    ray_address: Annotated[str, typer.Option(help="With --executor ray: the cluster, auto (the one started on this "
                                             "host) or HOST:PORT of its head.")] = "auto",
    labs_per_node: Annotated[int | None, typer.Option(min=1, help="With --executor ray: labs (variants) a node runs "
                                                      "at once (default: its CPU count // 2, at least 1).")] = None,
    dataplane: DataplaneOption = None,
) -> None:
    """Run a campaign: one controlled factor (ANI level or ablation, agent, model or agent mode)
    varied, every task variant replayed across its settings on a real SRv6 brownfield; results in SQLite."""
    from harness.campaign import make_spec, run_campaign, summary_line
    from harness.store import CampaignStore
    from substrate.features import check_root_and_tools

    use_dataplane(dataplane)
    if executor not in ("local", "ray"):
        fail(f"unknown executor {executor!r}; available: local, ray", code=2)
    if executor == "local" and (ray_address != "auto" or labs_per_node is not None):
        fail("--ray-address and --labs-per-node are for --executor ray", code=2)
    if executor == "local":
        check_root_and_tools()  # the Ray executor checks every node instead (harness.cluster)
    else:
        from harness.cluster import check_address

        check_address(ray_address)  # a wrong address is said before anything is built
    levels = _csv(ani)
    if set(_csv(agent)) <= {"scripted", "noisy"}:
        # the scripted operator has no reference solution at some levels of some classes: skip
        # those runs, and say so (a run that could only fail would be counted as the level's)
        from harness.campaign import parse_levels
        from harness.tasks import skipped_levels

        skipped = skipped_levels(task, parse_levels(levels))
        for lv, why in skipped.items():
            err.print(f"skipped {lv}: the {','.join(_csv(agent))} agent has no reference solution of {task} at this "
                      f"level ({why})", highlight=False, markup=False)
        levels = [lv for lv in parse_levels(levels) if lv not in skipped]
        if not levels:
            fail(f"no level of --ani {ani} can express a reference solution of {task}")
    spec = make_spec(
        ani=levels, agent=_csv(agent), model=_csv(model) if model else [None], task=task, variants=variants,
        manifest=_manifest_path(manifest), seed=seed, density=density, fault_rate=faults, budget_steps=budget_steps,
        wall_cap_s=wall_cap, agent_options=_opts(agent_opt), campaign_id=campaign_id,
        mode=_csv(mode) if mode else None, budget_tokens=budget_tokens, dataplane=_dataplane(executor),
    )
    from harness.agents.base import make_agent

    for name in spec.agent:
        for m in spec.model:
            for md in spec.mode:
                a = make_agent(name, {**spec.agent_options, **({"model": m} if m else {}), **({"mode": md} if md else {})})
                pre = getattr(a, "preflight", None)
                if pre is not None:
                    pre()
    db.parent.mkdir(parents=True, exist_ok=True)
    with CampaignStore(db) as store:
        if spec.campaign_id in store.campaigns() and not resume:
            fail(f"campaign {spec.campaign_id!r} exists in {db}: add --resume to continue it, or give another --id")
    total = spec.variants * len(spec.settings)
    settings = escape(", ".join(spec.settings))  # free text when the model is the factor
    out.print(f"campaign [bold]{escape(spec.campaign_id)}[/]: factor {spec.factor} = {settings}; "
              f"task {spec.task} x {spec.variants} variants; agent {','.join(spec.agent)}; lambda {spec.fault_rate}; "
              f"density {spec.density}; budget {spec.budget_steps} steps"
              + (f", {spec.budget_tokens} tokens" if spec.budget_tokens else "")
              + (f"; mode {spec.mode[0]}" if spec.factor != "mode" and spec.mode[0] else ""), highlight=False)
    with CampaignStore(db) as store, Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err,
    ) as progress:
        bar = progress.add_task("runs", total=total)
        if spec.campaign_id in store.campaigns():
            progress.update(bar, completed=sum(1 for r in store.rows(spec.campaign_id) if r.status in ("done", "failed")))

        def on_run(key: str, rec) -> None:  # noqa: ANN001
            if rec is None:
                progress.update(bar, description=f"running {escape(key)}")
                return
            progress.advance(bar)
            progress.console.print(escape(summary_line(rec)), highlight=False)

        cleaned: list[str] = []
        try:
            if executor == "ray":
                from harness.cluster import run_campaign_ray

                node_bars: dict[str, int] = {}

                def on_nodes(nodes: list[tuple[str, int]]) -> None:
                    for label, n in nodes:
                        node_bars[label] = progress.add_task(f"  {escape(label)}: {n} lab(s)", total=None)

                def on_node_run(key: str, rec, node: str) -> None:  # noqa: ANN001
                    on_run(key, rec)
                    if rec is not None:
                        progress.advance(node_bars[node])

                def on_cleanup(node: str, line: str) -> None:
                    cleaned.append(f"{node}: {line}")

                run_campaign_ray(spec, store, results_dir=results, address=ray_address, labs_per_node=labs_per_node,
                                 resume=resume, on_run=on_node_run, on_nodes=on_nodes, on_cleanup=on_cleanup)
            else:
                run_campaign(spec, store, results_dir=results, resume=resume, on_run=on_run,
                             on_stage=lambda m: progress.update(bar, description=escape(m)))
        except KeyboardInterrupt:
            for line in cleaned:  # what each Ray host removed, or that it did not answer
                err.print(escape(line), highlight=False)
            left = any("harness lab cleanup" in line for line in cleaned)
            err.print(f"interrupted: the lab{'s were' if executor == 'ray' else ' was'} "
                      f"{'not all destroyed (above)' if left else 'destroyed'}; resume with the "
                      f"same options and --resume (campaign {spec.campaign_id})", highlight=False)
            raise typer.Exit(130) from None
        if report:
            from harness.report import build_report

            out.print(build_report(store, spec.campaign_id))
    out.print(f"results: {db} (harness report {spec.campaign_id} --db {db})", highlight=False, markup=False)


task_app = typer.Typer(help="Task classes: list, show a variant, validate reference solutions.", no_args_is_help=True)


@task_app.command("list")
@friendly_errors
def task_list() -> None:
    """List the task classes (kind, prompt template, levels without a reference solution) and
    the protocol templates (harness/templates/library)."""
    from harness.tasks import TASK_CLASSES
    from harness.templates.schema import LEVELS
    from harness.templates.tasks import broken_templates, templates

    t = Table("class", "kind", "request (prompt template, identical across variants)", "no reference at")
    for c in TASK_CLASSES.values():
        t.add_row(c.name, c.kind, escape(c.prompt), escape("; ".join(f"{k}: {v}" for k, v in c.inexpressible.items())))
    out.print(t)
    t = Table("template", "family", "goal", "requires", "reference levels")
    for name, tpl in sorted(templates().items(), key=lambda kv: (kv[1].family, kv[0])):
        levels = [lv for lv in LEVELS if tpl.cannot(lv) is None]
        t.add_row(name, tpl.family, escape(tpl.title), ", ".join(tpl.requires.layers) or "-", ", ".join(levels))
    out.print(t)
    bad = broken_templates()
    for why in bad.values():
        err.print(f"template file left out: {why}", highlight=False, markup=False)
    if bad:
        raise typer.Exit(1)


@task_app.command("show")
@friendly_errors
def task_show(
    task_class: Annotated[str, typer.Argument(help="Task class.")],
    variant: Annotated[int, typer.Option(help="Variant index.")] = 0,
    seed: Annotated[int, typer.Option(min=0, help="Scenario seed of variant 0.")] = 7,
    density: Annotated[int | None, typer.Option(min=1, help="State density (default 2; a template on its default "
                                                "manifest: 1).")] = None,
    manifest: Annotated[str | None, typer.Option(help=f"Scenario manifest (default {DEFAULT_MANIFEST}; a template: "
                                                 f"{TEMPLATE_MANIFEST}).")] = None,
    reveal: Annotated[bool, typer.Option(help="Also list the hidden test cases.")] = False,
) -> None:
    """Show one variant: the prompt, the attached files, and how many hidden checks it has."""
    from harness.tasks import make_variant
    from substrate.scenario import build, load_manifest

    from harness.templates.tasks import is_template

    template = is_template(task_class)
    path, dens = task_manifest(template, manifest, density)
    if template:  # a template's instances share one scenario (NetConfArena V-A3)
        sc = build(load_manifest(_manifest_path(path)), seed=seed, density=dens)
    else:
        sc = build(load_manifest(_manifest_path(path)), seed=seed + variant, density=dens)
    v = make_variant(task_class, sc, variant)
    out.print(f"[bold]prompt[/]\n{escape(v.prompt)}\n")
    for name, text in v.files.items():
        if name != "design.md":
            out.print(f"[bold]{name}[/]\n{escape(text)}")
    out.print(f"design.md: {len(v.files['design.md'].splitlines())} lines (identical for every variant)")
    out.print(f"customer-side setup: {len(v.setup)} steps; hidden test cases: {len(v.test_cases)}; "
              f"damage checks: {len(v.damage_checks)}", highlight=False)
    if reveal:
        for tc in v.test_cases:
            out.print(f"  {escape(tc.id)}: {escape(tc.description)}", highlight=False)


def _dataplane(executor: str) -> str:
    """The data plane this campaign's labs run on: this machine's choice (local executor; the
    Ray executor checks every node, which must choose the same)."""
    from substrate.dataplane import select

    choice = select()
    # none usable: the first lab deploy refuses in one line, after the campaign's own checks
    return choice.dataplane or "kernel"


@task_app.command("validate")
@friendly_errors
def task_validate(
    task_class: Annotated[str, typer.Argument(help="Task class.")],
    ani: Annotated[str, typer.Option(help="Levels whose reference solution to apply.")] = "A0,A1,A2,A3-T",
    variants: Annotated[int | None, typer.Option(min=1, help="Variants to validate (default 3; a template: its 5 "
                                                 "instances).")] = None,
    seed: Annotated[int, typer.Option(min=0, help="Scenario seed of variant 0.")] = 7,
    density: Annotated[int | None, typer.Option(min=1, help="State density (default 2; a template on its default "
                                                "manifest: 1).")] = None,
    manifest: Annotated[str | None, typer.Option(help=f"Scenario manifest (default {DEFAULT_MANIFEST}; a template: "
                                                 f"{TEMPLATE_MANIFEST}).")] = None,
    lab: Annotated[str | None, typer.Option(help="A template: validate on this deployed scenario lab instead of "
                                            "deploying one.")] = None,
    dataplane: DataplaneOption = None,
) -> None:
    """Apply each level's reference solution (the scripted operator) to each variant in a real lab
    and check that every test case passes and no baseline invariant breaks (NetConfArena IV-C).
    TASK_CLASS may be a protocol template (harness task list): its instances share one lab."""
    use_dataplane(dataplane)
    variants_given = variants
    variants = variants or 3
    import tempfile

    from harness.ablations import parse_ani_settings
    from harness.run import RunSpec, execute_run
    from harness.tasks import TASK_CLASSES, make_variant, skipped_levels, variant_skips
    from substrate.scenario import build, load_manifest
    from substrate.scenario.deploy import deploy_scenario

    levels = parse_ani_settings(_csv(ani))
    from harness.templates.tasks import is_template

    template = is_template(task_class)
    manifest, density = task_manifest(template, manifest, density)
    if template:
        _validate_template(task_class, [str(x) for x in levels], instances=variants_given or 5, seed=seed,
                           density=density, manifest=manifest, lab_name=lab)
        return
    if task_class not in TASK_CLASSES:
        fail(f"unknown task class {task_class!r}; known: {', '.join(TASK_CLASSES)}")
    skipped = skipped_levels(task_class, [str(lv) for lv in levels])
    for lv, why in skipped.items():
        err.print(f"skipped {lv}: no reference solution at this level ({why})", highlight=False, markup=False)
    levels = [lv for lv in levels if str(lv) not in skipped]
    if not levels:
        fail(f"no level of --ani {ani} can express a reference solution of {task_class}")
    m = load_manifest(_manifest_path(manifest))
    table = Table("variant", "level", "test cases", "damage checks", "result")
    bad = 0
    with tempfile.TemporaryDirectory(prefix="anibench-validate-") as tmp:
        for v in range(variants):
            sc = build(m, seed=seed + v, density=density)
            var = make_variant(task_class, sc, v)
            own = variant_skips(var, [str(lv) for lv in levels])
            for lv, why in own.items():
                err.print(f"variant {v}: skipped {lv}: no reference solution ({why})", highlight=False, markup=False)
            with err.status(f"variant {v}: deploying"), deploy_scenario(sc, f"validate-{os.getpid() % 100000}") as lab:
                for level in [lv for lv in levels if str(lv) not in own]:
                    spec = RunSpec(campaign_id="validate", run_key=f"validate/{level}/{v}", factor="ani",
                                   setting=str(level), level=level.level, ablations=list(level.ablations),
                                   agent="scripted", density=density, run_dir=Path(tmp) / str(level) / str(v))
                    rec, verdicts = execute_run(lab, spec, var)
                    ok = rec.task_pass and rec.damage_free
                    bad += not ok
                    failed = [x.id for x in verdicts if not x.ok]
                    table.add_row(str(v), str(level), f"{rec.test_cases_passed}/{rec.test_cases_total}",
                                  f"{len(var.damage_checks) - len(rec.violated_invariants)}/{len(var.damage_checks)}",
                                  "[green]valid[/]" if ok else f"[red]INVALID[/] {escape(', '.join(failed[:3]))}")
    out.print(table)
    if bad:
        raise typer.Exit(1)


def _validate_template(name: str, levels: list[str], *, instances: int, seed: int, density: int, manifest: str,
                       lab_name: str | None) -> None:
    """``harness task validate TEMPLATE``: every instance at every level on one lab (a level
    the template cannot express is listed as skipped, with the reason)."""
    import contextlib
    import tempfile

    from harness.templates.validate import validate_template
    from substrate.lab import Lab
    from substrate.scenario import build, load_manifest
    from substrate.scenario.deploy import deploy_scenario, load_scenario

    with tempfile.TemporaryDirectory(prefix="anibench-validate-") as tmp, contextlib.ExitStack() as stack:
        if lab_name:
            lab = Lab.attach(lab_name)
            sc = load_scenario(lab)
        else:
            sc = build(load_manifest(_manifest_path(manifest)), seed=seed, density=density)
            with err.status("deploying the scenario"):
                lab = stack.enter_context(deploy_scenario(sc, f"validate-{os.getpid() % 100000}"))
        rows = validate_template(lab, sc, name, levels, Path(tmp), instances=instances)
    table = Table("template", "instance", "level", "test cases", "damage checks", "config F1", "result")
    for r in rows:
        style = {"valid": "green", "INVALID": "red", "skipped": "yellow", "refused": "red"}[r.status]
        f1 = "-" if r.config_f1 is None else f"{r.config_f1:.2f}"
        table.add_row(r.template, str(r.instance), r.level, r.test_cases, r.damage_checks, f1,
                      f"[{style}]{r.status}[/] {escape(r.detail)}")
    out.print(table)
    if any(r.status in ("INVALID", "refused") for r in rows):
        raise typer.Exit(1)
