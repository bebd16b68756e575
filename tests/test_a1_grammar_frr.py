"""The A1 allowlist checked against FRR 8.4's own parser, both ways (issue 10 item 3), so that
the grammar cannot drift from FRR again:

- every FRR command form of the grammar has an example line that the grammar accepts and that
  FRR's parser accepts in the form's mode (vtysh dry run, ``vtysh -C -f FILE``), and so does its
  ``no`` form where the grammar allows one;
- every command FRR has in a mode the grammar covers (vtysh's ``list`` in that mode) is either
  offered by the grammar or excluded in allowlist.yaml with a reason, and every exclusion names
  commands FRR has.

vtysh's dry run parses with vtysh's own copy of every daemon's command tree and needs no
running daemon, so this runs on any machine with FRR installed (CI installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from servers.a1_wrapper.grammar import Grammar, GrammarError
from servers.a1_wrapper.patterns import match

pytestmark = pytest.mark.skipif(shutil.which("vtysh") is None, reason="FRR's vtysh is not installed (./install.sh)")


@pytest.fixture(scope="module")
def g() -> Grammar:
    return Grammar.load()


def dry_run(tmp_path: Path, lines: list[str]) -> list[str]:
    """vtysh's dry-run errors for a configuration file of ``lines`` (empty: FRR accepts all)."""
    f = tmp_path / "frr.conf"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    r = subprocess.run(["vtysh", "-C", "-f", str(f)], capture_output=True, text=True, timeout=60)
    return [ln for ln in (r.stdout + r.stderr).splitlines() if re.match(r"line \d+:", ln)]


def frr_list(tmp_path: Path, context: list[str]) -> list[str]:
    """The command forms FRR has in the mode ``context`` enters (vtysh's ``list`` there)."""
    f = tmp_path / "list.conf"
    f.write_text("\n".join([*context, "list"]) + "\n", encoding="utf-8")
    r = subprocess.run(["vtysh", "-C", "-f", str(f)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    return [ln.strip() for ln in r.stdout.splitlines() if ln.startswith("    ")]


def keys_of(form: str) -> list[str]:
    """The leading keywords of an FRR form (up to two), alternatives expanded:
    ``[no] isis circuit-type <level-1|...>`` -> ``["isis circuit-type"]``,
    ``<ip|ipv6> router WORD`` -> ``["ip router", "ipv6 router"]``."""
    form = re.sub(r"^(\[no\] |no )", "", form)
    keys = [[]]
    for tok in form.split()[:2]:
        tok = tok if tok.startswith("<") else tok.split("<", 1)[0]
        m = re.fullmatch(r"<([a-z0-9-]+(?:\|[a-z0-9-]+)+)>", tok)
        if m:
            keys = [[*k, alt] for k in keys for alt in m.group(1).split("|")]
        elif re.fullmatch(r"[a-z][a-z0-9.-]*", tok):
            keys = [[*k, tok] for k in keys]
        else:
            break
    return [" ".join(k) for k in keys if k]


def offered(g: Grammar, mode: str, key: str) -> bool:
    """Some command of ``mode`` starts with the words of ``key``."""
    words = key.split()
    return any(match(c.pattern, words).ok or match(c.pattern, words).prefix_ok for c in g.modes[mode].commands)


def test_every_form_has_an_example_the_grammar_accepts(g: Grammar) -> None:
    for name, mode in g.modes.items():
        for c in mode.commands:
            assert c.example, f"{name}: {c.text!r} has no example"
            lines = [*mode.context, c.example]
            cmds = g.parse_config("r1", lines, is_router=True)
            assert cmds[-1].mode == name and cmds[-1].family == "frr", (name, c.example, cmds[-1])


def test_every_allowed_form_parses_in_frr(g: Grammar, tmp_path: Path) -> None:
    """Direction 1: what A1 offers, FRR 8.4 accepts (the examples and their `no` forms)."""
    failures = []
    for name, mode in g.modes.items():
        for c in mode.commands:
            variants = [c.example] + ([c.no_example or f"no {c.example}"] if c.no and not c.enters else [])
            for line in variants:
                errs = dry_run(tmp_path, [*mode.context, line])
                if errs:
                    failures.append(f"{name}: {line!r}: {errs}")
    assert not failures, "\n".join(failures)


def test_every_frr_command_of_a_covered_mode_is_offered_or_excluded(g: Grammar, tmp_path: Path) -> None:
    """Direction 2: what FRR 8.4 has in a mode the grammar covers, A1 offers, unless the
    allowlist excludes it with a reason; no exclusion is stale or contradicts an offer."""
    missing, stale, contradicting = [], [], []
    for name, mode in g.modes.items():
        forms = frr_list(tmp_path, mode.context)
        assert len(forms) > 5, f"vtysh list in {name} mode gave {forms}"
        keys = sorted({k for f in forms for k in keys_of(f)})
        for k in keys:
            if not offered(g, name, k) and mode.exclusion(k.split()) is None:
                missing.append(f"{name}: {k!r}")
        for ex in mode.excluded:
            if not any(k == ex or k.startswith(ex + " ") for k in keys):
                stale.append(f"{name}: {ex!r}")
            if offered(g, name, ex):
                contradicting.append(f"{name}: {ex!r}")
    assert not missing, "FRR commands neither offered nor excluded:\n" + "\n".join(missing)
    assert not stale, "exclusions of commands FRR 8.4 does not have:\n" + "\n".join(stale)
    assert not contradicting, "excluded and offered at once:\n" + "\n".join(contradicting)


@pytest.mark.parametrize(("lines", "why"), [
    (["interface eth1", "mtu 1400"], "not an allowed FRR configuration command in interface mode"),  # not in FRR 8.4
    (["interface eth1", "description help?"], "ends with '?'"),
    (["interface eth1", "description a| b"], "output filter"),
    (["interface eth1", "description bell\x07"], "control characters"),
    (["debug isis adj-packets"], "'debug' is outside what A1 manages"),
])  # fmt: skip
def test_refusals_follow_frr(g: Grammar, lines: list[str], why: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(why)):
        g.parse_config("r1", lines, is_router=True)


@pytest.mark.parametrize("text", ["Zürich–PoP ✓", "東京 PoP", "emoji 👨‍👩‍👧 family", "a\u00a0no-break space", "rtl שלום",
                                  "quotes \"x\" 'y' $HOME; a|b & c", "a ? b", "mid?dle"])  # fmt: skip
def test_utf8_and_symbols_frr_accepts_are_accepted(g: Grammar, tmp_path: Path, text: str) -> None:
    """Issue 10 item 4: what FRR accepts in a description, A1 accepts, byte for byte."""
    (_, cmd) = g.parse_config("r1", ["interface eth1", f"description {text}"], is_router=True)
    assert cmd.text == f"description {text}"
    assert dry_run(tmp_path, ["interface eth1", f"description {text}"]) == []
