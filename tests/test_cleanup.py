"""``harness lab cleanup --prefix``: on a shared machine a user removes only the leftovers of their
own labs (new-user finding, issue 34). No lab, namespace or cgroup is made or touched: the lab
directory is a temporary one and the namespaces and cgroups are names fed to :func:`substrate.cleanup`
(what it would remove is recorded instead)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from substrate.cleanup import CleanupReport, cleanup
from substrate.lab import STAGING_SUFFIX

#: The module (``substrate.cleanup`` as an attribute is the function ``substrate`` exports).
cleanup_mod = importlib.import_module("substrate.cleanup")


@pytest.fixture
def machine(tmp_path: Path, monkeypatch) -> dict[str, list]:  # noqa: ANN001
    """Leftovers of alice's and bob's labs: a lab directory being staged by a dead creator each
    (``alice-1``, ``bob-1``), stray namespaces (``alice-2``, ``bob-2``), cgroups of labs whose
    directory is gone (``alice-3``, ``bob-3``). Yields what cleanup removed: namespaces, cgroups."""
    labs = tmp_path / "labs"
    labs.mkdir()
    for name in ("alice-1", "bob-1"):
        (labs / f"{name}{STAGING_SUFFIX}999999999").mkdir()  # no record: its creator is not running
    removed: dict[str, list] = {"netns": [], "cgroups": []}
    monkeypatch.setattr(cleanup_mod, "LABS_DIR", labs)
    monkeypatch.setattr(cleanup_mod, "lab_dir", lambda name: labs / name)
    monkeypatch.setattr(cleanup_mod, "_list_netns", lambda: ["anibench-alice-2-r1", "anibench-bob-2-r1"])
    monkeypatch.setattr(cleanup_mod, "kill_netns_processes", lambda names: 0)
    monkeypatch.setattr(cleanup_mod, "delete_netns", lambda names: removed["netns"].extend(names))
    monkeypatch.setattr(cleanup_mod.confine, "lab_cgroups", lambda: {"alice-3": [tmp_path / "a"], "bob-3": [tmp_path / "b"]})
    monkeypatch.setattr(cleanup_mod.confine, "kill_cgroups", lambda dirs: removed["cgroups"].extend(dirs) or 0)
    return removed


def test_cleanup_with_a_prefix_removes_only_the_leftovers_of_labs_so_named(machine, tmp_path: Path) -> None:
    rep = cleanup(prefix="alice-")
    assert rep.labs == [f"alice-1{STAGING_SUFFIX}999999999"] and rep.namespaces == ["anibench-alice-2-r1"]
    assert machine == {"netns": ["anibench-alice-2-r1"], "cgroups": [tmp_path / "a"]}
    assert (tmp_path / "labs" / f"bob-1{STAGING_SUFFIX}999999999").is_dir()
    rep = cleanup()  # the default: every leftover (the fed namespaces are still listed: both again)
    assert rep.labs == [f"bob-1{STAGING_SUFFIX}999999999"] and rep.namespaces == ["anibench-alice-2-r1", "anibench-bob-2-r1"]
    assert machine["cgroups"] == [tmp_path / "a", tmp_path / "a", tmp_path / "b"]


def test_lab_cleanup_passes_its_prefix_and_keeps_every_lab_as_default(monkeypatch) -> None:
    import substrate
    import substrate.features

    calls: list[dict] = []
    monkeypatch.setattr(substrate, "cleanup", lambda **kw: calls.append(kw) or CleanupReport())
    monkeypatch.setattr(substrate.features, "check_root_and_tools", lambda **kw: None)
    for args in (["--prefix", "alice-"], []):
        res = CliRunner().invoke(app, ["lab", "cleanup", *args])
        assert res.exit_code == 0 and "removed 0 lab(s)" in res.output, res.output
    assert calls == [{"all_labs": False, "prefix": "alice-"}, {"all_labs": False, "prefix": ""}]
