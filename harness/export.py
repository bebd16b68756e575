"""Trajectories as data people can train on (NetConfArena section III-C: "successful trajectories
can be used as demonstrations, while failed trajectories can be used to construct preference
pairs"): ``harness export CAMPAIGN --format sft|preference|jsonl -o FILE``.

Formats (one JSON object per line; the JSON Schema of each is shipped in ``harness/schemas/`` and
printed by :func:`export_schemas`):

- ``sft`` (:class:`SftRecord`): one line per run that is a clean success, in the OpenAI chat
  fine-tuning format with tool calls -- ``{"messages": [...], "tools": [...]}``. The messages are
  the react mode's system prompt (with the ANI server's instructions), the HAI request (prompt and
  attached files) as the user message, then for every tool call the server recorded an assistant
  turn calling it and a tool message with its result as the agent saw it (cut to
  :data:`harness.chat.MAX_OBSERVATION` characters, ``error: `` before a failed call's text); the
  conversation ends with the assistant's ``submit`` call. The tools are the level's MCP tools as
  chat-completions functions. Rebuilt from the server-side record, so every agent's runs export the
  same way (the scripted operator's reference solutions included); the model's own text, plans and
  malformed calls are not in it. OpenAI's uploader refuses unknown keys: ``metadata`` (which run
  the line comes from) is added only with ``--metadata``.
- ``preference`` (:class:`PreferenceRecord`): pairs of runs of the same task variant (same
  request, same scenario, same faults: paired runs of the campaign) that were offered the same tools
  and the same prompt, where one run is a clean success (``chosen``) and the other a clean or
  destructive failure or a dangerous success (``rejected``): ``{"prompt": [system, user],
  "chosen": [...], "rejected": [...], "tools": [...], "metadata": {...}}`` -- the conversational
  preference layout of TRL's DPO trainer, messages as in ``sft``. ``--no-metadata`` leaves
  ``metadata`` out.
- ``jsonl`` (:class:`RunExport`): one line per run with everything about it: the run record, the
  request, the tools offered, every tool call as recorded (:class:`servers.common.CallRecord`),
  the verdicts with their evidence, and the agent's own account (tokens, mode, events).

Filters select runs by ANI level (a level matches its ablated settings too; ``A1+blocklist``
matches that setting only), model, agent mode and outcome label; runs the harness could not
complete are never exported. For ``preference``, the chosen side is any clean success matching the
level, model and mode filters; the outcome filter applies to the rejected side.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.errors import AnibenchError
from harness.runfiles import RunFiles, load_run_files
from harness.store import CampaignStore, OutcomeLabel, RunRecord, RunStatus

__all__ = ["FORMATS", "ExportFilter", "ExportSummary", "PreferenceRecord", "RunExport", "SftRecord", "export",
           "export_schemas"]

FORMATS = ("sft", "preference", "jsonl")
#: Version of the export formats (in ``RunExport.schema_version`` and each schema's ``$id``).
EXPORT_VERSION = 1


# --- the chat shapes (OpenAI chat completions) ----------------------------------------------------

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChatFunctionCall(_Strict):
    """The function a tool call invokes."""

    name: str = Field(description="Tool name.")
    arguments: str = Field(description="Arguments as a JSON object, in JSON text (as the API sends them).")


class ChatToolCall(_Strict):
    """One tool call of an assistant turn."""

    id: str = Field(description="Call id, answered by the tool message with the same tool_call_id.")
    type: Literal["function"] = "function"
    function: ChatFunctionCall


class SystemMessage(_Strict):
    """The system prompt."""

    role: Literal["system"] = "system"
    content: str


class UserMessage(_Strict):
    """A user message: the HAI request (prompt, then each attached file)."""

    role: Literal["user"] = "user"
    content: str


class AssistantMessage(_Strict):
    """An assistant turn calling one tool."""

    role: Literal["assistant"] = "assistant"
    content: str = Field(default="", description="The assistant's text (empty: rebuilt from the server's record).")
    tool_calls: list[ChatToolCall] = Field(min_length=1)


class ToolMessage(_Strict):
    """A tool's result, as the agent saw it."""

    role: Literal["tool"] = "tool"
    tool_call_id: str
    content: str = Field(description="The result text, or 'error: ' and the error text; cut to 12000 characters.")


Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


class FunctionSpec(_Strict):
    """A tool offered to the model."""

    name: str
    description: str
    parameters: dict[str, Any] = Field(description="JSON Schema of the arguments (the MCP tool's inputSchema).")


class ToolSpec(_Strict):
    """A chat-completions tool."""

    type: Literal["function"] = "function"
    function: FunctionSpec


class RunMetadata(_Strict):
    """Which run a line comes from."""

    campaign_id: str
    run_key: str
    setting: str = Field(description="Setting of the campaign's controlled factor.")
    variant: int = Field(description="Task-variant index (paired across settings).")
    task_class: str
    scenario_seed: int
    fault_seed: int
    level: str | None
    ablations: list[str]
    agent: str
    model: str | None
    mode: str | None
    outcome_label: str
    test_case_score: float | None
    steps: int
    tokens: int = Field(description="Prompt + completion tokens of the run (0 when not measured).")


class SftRecord(_Strict):
    """One clean-success run in the OpenAI chat fine-tuning format with tool calls."""

    messages: list[Message] = Field(description="system, user (the request), then assistant tool call / tool result "
                                                "pairs; the last message is the assistant's submit call.")
    tools: list[ToolSpec] = Field(description="The level's tools, as offered to the agent.")
    metadata: RunMetadata | None = Field(default=None, description="Only with --metadata (OpenAI refuses unknown keys).")


class PreferenceMetadata(_Strict):
    """Which runs a pair comes from."""

    campaign_id: str
    variant: int
    task_class: str
    scenario_seed: int
    chosen: RunMetadata
    rejected: RunMetadata


class PreferenceRecord(_Strict):
    """A clean success against a failure or dangerous success on the same task variant (TRL's
    conversational preference layout)."""

    prompt: list[Message] = Field(description="The shared context: system prompt and request.")
    chosen: list[Message] = Field(min_length=1, description="The clean success's turns after the prompt.")
    rejected: list[Message] = Field(min_length=1, description="The other run's turns after the prompt.")
    tools: list[ToolSpec]
    metadata: PreferenceMetadata | None = None


class RunRequest(_Strict):
    """The HAI request of a run."""

    prompt: str
    files: dict[str, str]


class RunExport(BaseModel):
    """Everything about one run."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = EXPORT_VERSION
    record: RunRecord = Field(description="The run record, as stored.")
    request: RunRequest | None = Field(description="The request; None when the run's hai.json is missing.")
    instructions: str | None = Field(default=None, description="The ANI server's instructions to the agent.")
    tools: list[dict[str, Any]] | None = Field(description="The MCP tools offered (name, description, inputSchema); "
                                                          "None when the run's tools.json is missing.")
    trajectory: list[dict[str, Any]] = Field(description="Every tool call as the server recorded it "
                                                          "(servers.common.CallRecord), in order.")
    verdicts: list[dict[str, Any]] = Field(description="Every verdict of the observer with its evidence: the task's "
                                                        "test cases first, then the damage checks.")
    agent: dict[str, Any] = Field(description="The agent's own account (tokens, model, mode, stop reason, events).")
    missing: list[str] = Field(default_factory=list, description="Files of the run that could not be read.")


def export_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schema of each format (draft 2020-12), by format name."""
    out = {}
    for name, model in (("sft", SftRecord), ("preference", PreferenceRecord), ("jsonl", RunExport)):
        schema = model.model_json_schema()
        out[name] = {"$schema": "https://json-schema.org/draft/2020-12/schema",
                     "$id": f"anibench/export/{name}/v{EXPORT_VERSION}", **schema}
    return out


def schema_file(name: str) -> str:
    """The name of the shipped schema file of a format (in ``harness/schemas/``)."""
    return f"export-{name}.schema.json"


def shipped_schema(name: str) -> dict[str, Any]:
    """The shipped JSON Schema of a format."""
    return json.loads(resources.files("harness").joinpath("schemas", schema_file(name)).read_text(encoding="utf-8"))


# --- selection ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExportFilter:
    """Which runs to export (an empty list: any).

    Levels and modes are read as ``harness campaign`` reads ``--ani`` and ``--mode`` (``a1`` is
    ``A1``; ``React`` is ``react``), so a value the campaign would accept selects its runs, and
    one it would refuse is refused here too, instead of selecting nothing.

    Raises:
        AnibenchError: an unknown level, ablation, mode or outcome label.
    """

    levels: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        from harness.ablations import parse_ani_setting
        from harness.agents.modes import parse_mode

        known = [o.value for o in OutcomeLabel]
        bad = [o for o in self.outcomes if o not in known]
        if bad:
            raise AnibenchError(f"unknown outcome label(s) {', '.join(bad)}; known: {', '.join(known)}")
        object.__setattr__(self, "levels", [str(parse_ani_setting(x)) for x in self.levels])
        object.__setattr__(self, "modes", [str(parse_mode(x)) for x in self.modes])

    def unmatched(self, views: list[RunExportView]) -> list[str]:
        """The filter values no run of the campaign has, each with the values it has (so an
        export that selects nothing says why)."""
        have = {"level": {v.level for v in views} | {v.ani for v in views}, "model": {v.record.model for v in views},
                "mode": {v.mode for v in views}, "outcome": {v.outcome for v in views}}
        out = []
        for name, wanted in (("level", self.levels), ("model", self.models), ("mode", self.modes),
                             ("outcome", self.outcomes)):
            if missing := [w for w in wanted if w not in have[name]]:
                present = ", ".join(sorted(str(x) for x in have[name] if x)) or "none"
                out.append(f"no run has {name} {', '.join(missing)} (the campaign's: {present})")
        return out

    def design(self, r: RunExportView) -> bool:
        """The run matches the level, model and mode filters."""
        return ((not self.levels or r.level in self.levels or r.ani in self.levels)
                and (not self.models or r.record.model in self.models)
                and (not self.modes or r.mode in self.modes))

    def __call__(self, r: RunExportView) -> bool:
        return self.design(r) and (not self.outcomes or r.outcome in self.outcomes)


@dataclass
class RunExportView:
    """A run with what the export needs: its record, its level and mode (from the campaign spec for
    records older than those fields), its files."""

    record: RunRecord
    level: str | None
    ablations: list[str]
    mode: str | None
    files: RunFiles

    @property
    def ani(self) -> str:
        return "+".join([self.level or "?", *self.ablations])

    @property
    def outcome(self) -> str:
        return self.record.outcome_label.value if self.record.outcome_label else ""

    def metadata(self) -> RunMetadata:
        r = self.record
        return RunMetadata(campaign_id=r.campaign_id, run_key=r.run_key, setting=r.setting, variant=r.variant,
                           task_class=r.task_class, scenario_seed=r.scenario_seed, fault_seed=r.fault_seed,
                           level=self.level, ablations=self.ablations, agent=r.agent, model=r.model, mode=self.mode,
                           outcome_label=self.outcome, test_case_score=r.test_case_score, steps=r.steps,
                           tokens=r.tokens_in + r.tokens_out)


def _views(store: CampaignStore, campaign_id: str) -> list[RunExportView]:
    from harness.ablations import parse_ani_setting

    spec = store.campaign_spec(campaign_id)
    out = []
    for r in store.runs(campaign_id):
        if r.status is not RunStatus.done:
            continue
        level, ablations = r.level, list(r.ablations)
        if level is None:  # a version-1 record: the level is the setting or the campaign's fixed one
            text = r.setting if spec.get("factor") == "ani" else (spec.get("ani") or [None])[0]
            try:
                parsed = parse_ani_setting(text) if text else None
            except AnibenchError:
                parsed = None
            level, ablations = (parsed.level, list(parsed.ablations)) if parsed else (None, [])
        mode = r.mode or ("react" if r.agent == "openai" else None)  # before modes, the openai agent was react
        out.append(RunExportView(r, level, ablations, mode, load_run_files(r.trajectory_path)))
    return out


# --- conversations --------------------------------------------------------------------------------

class Unusable(Exception):  # noqa: N818 - a reason to skip a run, reported in the summary
    """A run cannot be rendered as a conversation (missing files, cut arguments)."""


def _tools(view: RunExportView) -> tuple[list[ToolSpec], str | None]:
    from harness.chat import tool_specs

    if not view.files.tools:
        raise Unusable("its tools.json is missing (run stored before the export existed)")
    specs = tool_specs(view.files.tools.get("tools") or [])
    return [ToolSpec.model_validate(s) for s in specs], view.files.tools.get("instructions")


def _prompt(view: RunExportView, instructions: str | None) -> list[Message]:
    from harness.chat import request_message, system_message

    hai = view.files.hai
    if not hai:
        raise Unusable("its hai.json is missing (run stored before the export existed)")
    return [SystemMessage(content=system_message("system", "react", instructions)),
            UserMessage(content=request_message(str(hai.get("prompt", "")), dict(hai.get("files") or {})))]


def _turns(view: RunExportView) -> list[Message]:
    """The run's tool calls as assistant/tool turns, up to and including the accepted submit call
    (whose result is left out: the conversation ends on the assistant's last action)."""
    from harness.chat import observation

    turns: list[Message] = []
    for c in view.files.calls:
        if c.get("arguments_truncated"):
            raise Unusable(f"the arguments of call {c.get('seq')} were cut when recorded")
        call_id = f"call_{c.get('seq')}"
        args = c.get("arguments")
        turns.append(AssistantMessage(tool_calls=[ChatToolCall(id=call_id, function=ChatFunctionCall(
            name=str(c.get("tool")), arguments=json.dumps(args if args is not None else {}, ensure_ascii=False)))]))
        if c.get("kind") == "submit" and not c.get("is_error"):
            break
        ok = not c.get("tool_error")
        text = (c.get("result") if ok else c.get("error")) or ""
        turns.append(ToolMessage(tool_call_id=call_id, content=observation(ok, str(text))))
    return turns


# --- export ---------------------------------------------------------------------------------------

@dataclass
class ExportSummary:
    """What an export wrote and what it left out, and why."""

    written: int = 0
    selected: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    unmatched: list[str] = field(default_factory=list)

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def __str__(self) -> str:
        why = "; ".join(f"{n} {w}" for w, n in self.skipped.items())
        return (f"{self.written} record(s) written from {self.selected} selected run(s)"
                + (f"; left out: {why}" if why else "") + "".join(f"; {u}" for u in self.unmatched))


def _line(rec: SftRecord | PreferenceRecord) -> str:
    """One JSON line; ``metadata`` left out (not null) when not asked for."""
    return rec.model_dump_json(exclude={"metadata"} if rec.metadata is None else None)


def _sft(views: list[RunExportView], keep: ExportFilter, summary: ExportSummary, metadata: bool) -> Iterator[str]:
    for v in views:
        if not keep(v):
            continue
        summary.selected += 1
        if v.outcome != OutcomeLabel.clean_success.value:
            summary.skip("not a clean success")
            continue
        try:
            tools, instructions = _tools(v)
            rec = SftRecord(messages=[*_prompt(v, instructions), *_turns(v)], tools=tools,
                            metadata=v.metadata() if metadata else None)
        except Unusable as e:
            summary.skip(f"unusable: {e}")
            continue
        yield _line(rec)


def _preference(views: list[RunExportView], keep: ExportFilter, summary: ExportSummary,
                metadata: bool) -> Iterator[str]:
    by_variant: dict[int, list[RunExportView]] = {}
    for v in views:
        if keep.design(v):
            by_variant.setdefault(v.record.variant, []).append(v)
    for variant, runs in sorted(by_variant.items()):
        chosen = [r for r in runs if r.outcome == OutcomeLabel.clean_success.value]
        rejected = [r for r in runs if r.outcome != OutcomeLabel.clean_success.value and keep(r)]
        summary.selected += len(chosen) + len(rejected)
        rendered: dict[str, tuple[list[Message], list[Message], list[ToolSpec]] | None] = {}
        for r in chosen + rejected:
            try:
                tools, instructions = _tools(r)
                rendered[r.record.run_key] = (_prompt(r, instructions), _turns(r), tools)
            except Unusable as e:
                summary.skip(f"run unusable: {e}")
                rendered[r.record.run_key] = None
        for c in chosen:
            for x in rejected:
                a, b = rendered[c.record.run_key], rendered[x.record.run_key]
                if a is None or b is None:
                    continue
                if a[2] != b[2] or a[0] != b[0]:
                    summary.skip("pair not formed: the runs were offered different tools or prompts")
                    continue
                if not b[1]:
                    summary.skip("pair not formed: the rejected run made no tool call")
                    continue
                meta = PreferenceMetadata(campaign_id=c.record.campaign_id, variant=variant,
                                          task_class=c.record.task_class, scenario_seed=c.record.scenario_seed,
                                          chosen=c.metadata(), rejected=x.metadata()) if metadata else None
                yield _line(PreferenceRecord(prompt=a[0], chosen=a[1], rejected=b[1], tools=a[2], metadata=meta))


def _jsonl(views: list[RunExportView], keep: ExportFilter, summary: ExportSummary) -> Iterator[str]:
    for v in views:
        if not keep(v):
            continue
        summary.selected += 1
        f = v.files
        request = RunRequest(prompt=str(f.hai.get("prompt", "")), files=dict(f.hai.get("files") or {})) if f.hai else None
        yield RunExport(record=v.record, request=request, instructions=(f.tools or {}).get("instructions"),
                        tools=(f.tools or {}).get("tools"), trajectory=f.calls, verdicts=f.verdicts, agent=f.agent,
                        missing=f.missing).model_dump_json()


def export(store: CampaignStore, campaign_id: str, fmt: str, out: Path, keep: ExportFilter | None = None, *,
           metadata: bool | None = None) -> ExportSummary:
    """Write the campaign's runs to ``out`` in format ``fmt`` (see the module docstring).

    Args:
        store: the results store.
        campaign_id: the campaign.
        fmt: ``sft``, ``preference`` or ``jsonl``.
        out: the file to write (replaced; written to a temporary name first, so a failed export
            leaves no half file).
        keep: which runs (default: all).
        metadata: add ``metadata`` to each line (default: off for ``sft``, on for ``preference``;
            ``jsonl`` lines are all metadata).

    Returns:
        How many records were written and what was left out, and why.

    Raises:
        AnibenchError: unknown format, or ``clean_success`` as the outcome of preference pairs'
            rejected side; UnknownCampaign: no such campaign; OSError: ``out`` cannot be written.
    """
    if fmt not in FORMATS:
        raise AnibenchError(f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    keep = keep or ExportFilter()
    if fmt == "preference" and OutcomeLabel.clean_success.value in keep.outcomes:
        raise AnibenchError("for preference pairs --outcome selects the rejected side, which is never a clean success; "
                            "choose among dangerous_success, clean_failure, destructive_failure")
    views = _views(store, campaign_id)
    summary = ExportSummary(unmatched=keep.unmatched(views))
    with_meta = metadata if metadata is not None else fmt == "preference"
    lines = (_sft(views, keep, summary, with_meta) if fmt == "sft"
             else _preference(views, keep, summary, with_meta) if fmt == "preference"
             else _jsonl(views, keep, summary))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for line in lines:
                f.write(line + "\n")
                summary.written += 1
        tmp.replace(out)
    except BaseException:  # any failure (a bad record, Ctrl-C) leaves no half file
        tmp.unlink(missing_ok=True)
        raise
    return summary


def write_schemas(directory: Path) -> list[Path]:
    """Write :func:`export_schemas` as the shipped files (``harness/schemas/``); returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, schema in export_schemas().items():
        p = directory / schema_file(name)
        p.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        paths.append(p)
    return paths


if __name__ == "__main__":  # python -m harness.export: regenerate the shipped schemas
    for p in write_schemas(Path(__file__).parent / "schemas"):
        print(p)
