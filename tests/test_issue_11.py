"""Issue 11 -- third-party agents in practice: what a user hits with real MCP clients, CLI agents
and ``harness serve``. Each item of the issue is a test here, against real labs and real stdio and
HTTP servers (a CLI agent and an LLM endpoint are stood in for by tests/fake_cli_agent.py and
tests/fake_openai.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import AnibenchError
from tests.conftest import REPO

HARNESS = [sys.executable, "-m", "harness.cli"]
SMALL_CAMPAIGN = REPO / "tests" / "data" / "small-campaign.yaml"


# -- 2: command templates are checked before anything is deployed ---------------------------------


@pytest.mark.parametrize(("template", "why"), [
    ("agent --env ${HOME}", "unknown placeholder {HOME}"),
    ("agent --json {\"a\": 1}", "unmatched '{'"),
    ("agent }", "Single '}' encountered"),
    ("agent {", "Single '{' encountered"),
    ("agent {prompt!r}", "unknown placeholder {prompt!r}"),
    ("agent {prompt:>9}", "unknown placeholder {prompt:>9}"),
    ("agent {}", "unknown placeholder {}"),
    ("agent {prompt.upper}", "unknown placeholder {prompt.upper}"),
    ("agent 'unclosed", "No closing quotation"),
    ("   ", "empty"),
])
def test_a_bad_command_template_is_refused_when_the_agent_is_made(template: str, why: str) -> None:
    from harness.agents.command import CommandAgent

    with pytest.raises(AnibenchError, match=__import__("re").escape(why)) as e:
        CommandAgent(template=template)
    assert "\n" not in str(e.value)
    if "placeholder" in why or "{" in why:
        assert "{{" in str(e.value)  # says how to write a literal brace


def test_literal_braces_are_written_twice() -> None:
    from harness.agents.command import CommandAgent

    a = CommandAgent(template="""agent --json '{{"a": {{"b": 1}}}}' --home '${{HOME}}' {prompt_file}""")
    assert [w.format(prompt_file="/p") for w in a.words] == ["agent", "--json", '{"a": {"b": 1}}', "--home", "${HOME}", "/p"]


def test_campaign_refuses_a_bad_template_in_one_line_before_any_lab(tmp_path: Path) -> None:
    db = tmp_path / "r" / "db.sqlite"
    r = subprocess.run([*HARNESS, "campaign", "--ani", "A1", "--agent", "command", "--agent-opt",
                        "template=/bin/echo ${HOME} }", "--variants", "1", "--manifest", str(SMALL_CAMPAIGN),
                        "--db", str(db), "--results", str(tmp_path / "runs")],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: command template word"), r.stderr
    assert not db.exists() and not (tmp_path / "runs").exists()  # nothing was started
