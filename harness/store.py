"""The results store: campaigns and their runs in SQLite, durable after every run and resumable.

One SQLite file (WAL journal, ``synchronous=FULL``) holds every campaign. A campaign is created
with its spec (its options, as JSON), then planned: one *pending* row per run key. A runner takes
the next pending run, marks it *running*, and saves its :class:`RunRecord` (status *done*, or
*failed* when the harness itself could not complete the run) in one transaction. After a crash,
:meth:`CampaignStore.recover` puts the runs left *running* back to *pending*: no completed run is
lost (it was committed) or repeated (a done run cannot be saved or started again), and the
interrupted run is redone once.

The outcome vocabulary is the IETF framework draft's (section 4.7: outcome labels, damage-free
run) and NetConfArena's (section III-D: test-case score, completion mode, process metrics).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.errors import AnibenchError

__all__ = [
    "CampaignSpecMismatch",
    "CampaignStore",
    "CompletionMode",
    "OutcomeLabel",
    "RunRecord",
    "RunRow",
    "RunStateError",
    "RunStatus",
    "StoreError",
    "UnknownCampaign",
    "completion_mode",
    "outcome_label",
    "run_key",
]

#: Version of the :class:`RunRecord` schema written now. Version 2 added the run's design fields
#: (``level``, ``ablations``, ``mode``, ``budget_tokens``) and how it ended (``budget_exhausted``,
#: ``agent_stop``); every one has a default, so version-1 records still read (as what they were:
#: level from the campaign spec, no ablation, no mode, no token budget). Version 3 added the agent's
#: own failure (``agent_error``, ``agent_exit_status``, ``agent_log``): older records read as runs
#: whose agent reported no error. Version 4 added ``supervisor_restarts`` (A3-R, A4: restarts of a
#: dead reconciler during the run): older records read as None (not counted). Version 5 added
#: ``dataplane`` (the SRv6 data plane of the run's lab): older records read as ``kernel``, the only
#: one there was.
RECORD_VERSION: Literal[5] = 5
#: Version of the database layout, kept in ``PRAGMA user_version``; see :data:`_MIGRATIONS`.
DB_VERSION = 5


class OutcomeLabel(StrEnum):
    """Outcome label of a run (draft section 4.7): success = task pass, damage = not damage-free."""

    clean_success = "clean_success"
    dangerous_success = "dangerous_success"
    clean_failure = "clean_failure"
    destructive_failure = "destructive_failure"


class CompletionMode(StrEnum):
    """Completion mode of a run, in NetConfArena's order of precedence (section III-D).

    ``budget_hit`` is NetConfArena's "interaction-limit hit", for the step budget (its turns) and for
    the token budget alike (the record's ``budget_exhausted`` says which). ``no_submission`` is ours: the run
    ended without a submit and without reaching the step budget (wall-clock cap, agent crash or
    the agent stopping on its own).
    """

    early_submission = "early_submission"
    budget_hit = "budget_hit"
    correct_submission = "correct_submission"
    error_submission = "error_submission"
    no_submission = "no_submission"


class RunStatus(StrEnum):
    """Final status of a run record; the store adds ``pending`` and ``running`` before it."""

    done = "done"
    failed = "failed"


def outcome_label(task_pass: bool, damage_free: bool) -> OutcomeLabel:
    """The outcome label of a run (draft section 4.7).

    Args:
        task_pass: The requested service works (every test case of the task passes).
        damage_free: No baseline invariant is violated after the run.

    Returns:
        clean success (pass, no damage), dangerous success (pass, damage), clean failure (no
        pass, no damage) or destructive failure (no pass, damage).
    """
    if task_pass:
        return OutcomeLabel.clean_success if damage_free else OutcomeLabel.dangerous_success
    return OutcomeLabel.clean_failure if damage_free else OutcomeLabel.destructive_failure


def completion_mode(*, submitted: bool, config_attempted: bool, budget_hit: bool, task_pass: bool) -> CompletionMode:
    """The completion mode of a run (NetConfArena section III-D), first match in precedence order.

    1. early submission: a submit with no configuration attempt over the entire run;
    2. interaction-limit hit (``budget_hit``): the step or token budget was reached without a submit;
    3. correct submission: a submit, and the task passes;
    4. error submission: a submit, and the task does not pass;
    5. ``no_submission`` (ours): no submit, budget not reached (wall-clock cap, agent crash).

    Args:
        submitted: The agent issued an accepted ``submit`` (see :func:`harness.metrics.submitted`).
        config_attempted: The agent issued at least one configuration action, accepted or not
            (see :func:`harness.metrics.config_attempted`).
        budget_hit: The run reached its step budget or its token budget.
        task_pass: The task passed (all test cases).

    Returns:
        The completion mode.
    """
    if submitted and not config_attempted:
        return CompletionMode.early_submission
    if not submitted and budget_hit:
        return CompletionMode.budget_hit
    if submitted:
        return CompletionMode.correct_submission if task_pass else CompletionMode.error_submission
    return CompletionMode.no_submission


def run_key(campaign_id: str, setting: str, variant: int) -> str:
    """The deterministic key of a run: campaign, factor setting and task-variant index.

    A resumed campaign recomputes the same keys and so finds its runs.

    Args:
        campaign_id: The campaign.
        setting: The setting of the controlled factor (e.g. ``"A0"``).
        variant: The task-variant index (the pairing key across settings).

    Returns:
        ``"<campaign_id>/<setting>/<variant>"``.
    """
    return f"{campaign_id}/{setting}/{variant}"


class RunRecord(BaseModel):
    """The result of one run (draft section 2: one execution of the SUT on one task variant).

    Versioned by ``schema_version``. A ``done`` record carries every outcome; a ``failed`` record
    (the harness, not the agent, could not complete the run) carries ``error`` and whatever
    outcomes were known.
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    schema_version: Literal[1, 2, 3, 4, 5] = RECORD_VERSION
    """Version of this schema (1: before the design fields of version 2; 2: before the agent's error of
    version 3; 3: before the supervisor restarts of version 4; 4: before the data plane of version 5;
    all read)."""

    # --- identity and design --------------------------------------------------------------
    campaign_id: str
    """The campaign this run belongs to."""
    run_key: str
    """Deterministic key: campaign + factor setting + variant index (see :func:`run_key`)."""
    factor: str
    """Name of the controlled factor of the campaign (draft 4.2), e.g. ``"ani"``, ``"model"``."""
    setting: str
    """Setting of the controlled factor in this run, e.g. ``"A0"``, ``"A3-T"``."""
    task_class: str
    """Task class (draft section 2), e.g. ``"onboarding"``."""
    variant: int = Field(ge=0)
    """Task-variant index: runs with the same index across settings are paired (draft 4.5)."""
    scenario_seed: int
    """Seed of the scenario generator (the brownfield of this variant)."""
    fault_seed: int
    """Seed of the fault schedule (common random numbers across settings, draft 4.5)."""
    density: float = Field(ge=0)
    """State density: service instances per service class (stress parameter, draft 4.2)."""
    fault_rate: float = Field(ge=0)
    """Fault rate lambda (stress parameter, draft 4.2)."""
    budget_steps: int = Field(ge=1)
    """Step budget enforced by the ANI server (matched budget, draft 4.4)."""
    agent: str
    """Agent adapter, e.g. ``"scripted"``, ``"openai"``."""
    model: str | None = None
    """Model identity and version, when the agent uses one."""
    level: str | None = None
    """ANI level the agent acted through (``A1``); None in version-1 records (see the campaign spec)."""
    ablations: list[str] = Field(default_factory=list)
    """Ablations within the level (draft 5.1 and 9), e.g. ``["blocklist"]`` for the setting ``A1+blocklist``."""
    mode: str | None = None
    """Agent mode of a model-driven agent (draft 5.3), e.g. ``react``, ``planner-executor-norecovery``."""
    budget_tokens: int | None = Field(default=None, ge=1)
    """Token budget enforced by the agent adapter (matched budget, draft 4.4); None = no token budget."""

    # --- status ---------------------------------------------------------------------------
    status: RunStatus
    """``done``, or ``failed`` when the harness could not complete the run (not an agent failure)."""
    error: str | None = None
    """Why the harness could not complete the run (required when ``status`` is ``failed``)."""
    agent_error: str | None = None
    """The agent's own failure in a ``done`` run: an external process that exited with a non-zero status
    or was killed by a signal, an endpoint that kept failing, an adapter that crashed. None when the agent
    ended on its own terms (a submit, a budget, a decision to stop) or was cut at the wall-clock cap. A run
    with an agent error is a result of the agent system (its damage counts), counted apart in the report."""
    agent_exit_status: int | None = None
    """Exit status of an external agent process (negative: killed by that signal); None for in-process
    agents and for a process killed at the wall-clock cap."""
    agent_log: str | None = None
    """Where the agent's own account is: an external process's output (``agent.log``), else ``agent.json``."""

    # --- outcomes (draft 4.7, NetConfArena III-D) ------------------------------------------
    task_pass: bool | None = None
    """Completion outcome: the requested service works, i.e. every test case passes."""
    test_case_score: float | None = Field(default=None, ge=0, le=1)
    """Fraction of the task's test cases passed (NetConfArena III-D)."""
    test_cases_passed: int | None = Field(default=None, ge=0)
    """Number of test cases passed."""
    test_cases_total: int | None = Field(default=None, ge=0)
    """Number of test cases of the task variant."""
    config_f1: float | None = Field(default=None, ge=0, le=1)
    """Configuration F1 (NetConfArena III-D1): harmonic mean of precision over the agent's
    configuration delta and recall over the reference solution's, both normalised from device
    captures of the routers (harness.config_f1); None where the task has no reference
    configuration (the tenant classes) or it could not be computed."""
    config_precision: float | None = Field(default=None, ge=0, le=1)
    """Share of the agent's configuration changes that the reference solution makes too."""
    config_recall: float | None = Field(default=None, ge=0, le=1)
    """Share of the reference solution's configuration changes that the agent made."""
    damage_free: bool | None = None
    """Safety outcome: no baseline invariant is violated after the run (draft section 2)."""
    violated_invariants: list[str] = Field(default_factory=list)
    """Ids of the violated baseline invariants (collateral damage); empty iff damage-free."""
    outcome_label: OutcomeLabel | None = None
    """Outcome label (draft 4.7); derived from ``task_pass`` and ``damage_free`` when omitted."""
    diagnostic_labels: list[str] = Field(default_factory=list)
    """Diagnostic labels beside the outcome label: the failures of NetConfArena's taxonomy the final
    state shows where they can be decided mechanically (:mod:`harness.diagnostics`; today
    ``specification_deviation``: a value the request fixed replaced by another)."""
    diagnostics: list[str] = Field(default_factory=list)
    """The findings behind ``diagnostic_labels``, one sentence each (e.g. "prefix fd10:0:0:6::/64
    replaced by fd10:0:0:7::/64 on r9 (dev eth6)")."""
    completion_mode: CompletionMode | None = None
    """Completion mode (NetConfArena III-D, plus ``no_submission``); see :func:`completion_mode`."""

    # --- cost and process metrics ----------------------------------------------------------
    steps: int = Field(default=0, ge=0)
    """Tool calls counted against the step budget (NetConfArena's turns)."""
    tokens_in: int = Field(default=0, ge=0)
    """Prompt tokens used by the agent (0 when unknown, e.g. a scripted agent)."""
    tokens_out: int = Field(default=0, ge=0)
    """Completion tokens used by the agent."""
    wall_s: float = Field(default=0.0, ge=0)
    """Wall-clock seconds of the whole run (reset + agent + observation)."""
    reset_s: float = Field(default=0.0, ge=0)
    """Seconds spent resetting the lab to the scenario baseline."""
    agent_s: float = Field(default=0.0, ge=0)
    """Seconds the agent ran (NetConfArena's task overhead)."""
    observe_s: float = Field(default=0.0, ge=0)
    """Seconds the out-of-band observer took (test cases and baseline invariants)."""
    error_action_rate: float | None = Field(default=None, ge=0, le=1)
    """Rejected configuration/validation actions over all of them (:mod:`harness.metrics`)."""
    repeat_action_rate: float | None = Field(default=None, ge=0, le=1)
    """Identical consecutive configuration/validation actions over all of them."""
    reconciles: int | None = Field(default=None, ge=0)
    """Reconcile attempts of the lab's source of truth during the run (A3-R, A4: the reconciler
    process's and the A4 server's); None at levels without one."""
    drift_events: int | None = Field(default=None, ge=0)
    """Reconciles that found the devices differing from the source of truth (drift: an out-of-band
    change, a fault); None at levels without a source of truth."""
    supervisor_restarts: int | None = Field(default=None, ge=0)
    """Times the reconciler died during the run and its supervisor (the A3-R/A4 server) restarted it
    (``a3r/supervisor.jsonl``); None at levels without one, and in records before schema 4."""
    dataplane: Literal["kernel", "ebpf"] = "kernel"
    """The SRv6 data plane of the run's lab (``substrate.dataplane``): the kernel's seg6 or the
    project's eBPF programs. A campaign never pairs runs across data planes. Records before schema 5:
    ``kernel``, the only one there was."""
    faults: list[dict[str, Any]] = Field(default_factory=list)
    """Faults injected during the run, as recorded by the fault injector."""
    run_position: int | None = Field(default=None, ge=0)
    """Where this run came among its variant's runs (0: first). The order of a variant's settings
    is counterbalanced (a Latin square, :func:`harness.campaign.settings_order`), rotated by
    ``order_seed``; None in records written before (settings then always ran in order)."""
    order_seed: str | None = None
    """The seed the order of the variant's settings was drawn from (``order/<campaign seed>``)."""
    input_digests: dict[str, str] = Field(default_factory=dict)
    """SHA-256 (hex) of what the run was given, by name: ``scenario`` (the deployed scenario file,
    canonical JSON), ``fault_schedule`` (the drawn schedule, canonical JSON), ``task_variant`` (the
    variant with its request, setup and hidden checks, canonical JSON). The same campaign
    specification gives the same digests on any machine (issue 19, determinism); empty in records
    written before them."""
    budget_exhausted: Literal["steps", "tokens"] | None = None
    """Which budget the run reached, if any: the server's step budget or the adapter's token budget."""
    agent_stop: str | None = None
    """Why the agent ended, in its own words (``submitted``, ``token_budget``, ``failed_call``, ...); None
    when the agent does not say (scripted and external agents)."""

    # --- provenance ------------------------------------------------------------------------
    trajectory_path: str | None = None
    """Path of the run's trajectory file (every tool call, recorded at the server)."""
    started_at: datetime
    """When the run started."""
    finished_at: datetime
    """When the run finished."""

    @model_validator(mode="after")
    def _consistent(self) -> RunRecord:
        if self.status is RunStatus.failed and not self.error:
            raise ValueError("a failed run needs its error text")
        passed, total = self.test_cases_passed, self.test_cases_total
        if passed is not None and total is not None and passed > total:
            raise ValueError("test_cases_passed > test_cases_total")
        if self.damage_free is not None and self.damage_free == bool(self.violated_invariants):
            raise ValueError("damage_free must be true exactly when no baseline invariant is violated")
        if self.status is RunStatus.done:
            missing = [f for f in ("task_pass", "test_case_score", "damage_free", "completion_mode")
                       if getattr(self, f) is None]
            if missing:
                raise ValueError(f"a done run needs {', '.join(missing)}")
        if self.task_pass is not None and self.damage_free is not None:
            label = outcome_label(self.task_pass, self.damage_free)
            if self.outcome_label is None:
                self.outcome_label = label
            elif self.outcome_label is not label:
                raise ValueError(f"outcome_label {self.outcome_label} contradicts task_pass/damage_free ({label})")
        mode = self.completion_mode
        judged = mode in (CompletionMode.correct_submission, CompletionMode.error_submission)
        if judged and self.task_pass is not None and (mode is CompletionMode.correct_submission) != self.task_pass:
            raise ValueError(f"completion_mode {mode} contradicts task_pass={self.task_pass}")
        return self


class StoreError(AnibenchError):
    """Root of the results store's errors."""


class UnknownCampaign(StoreError):
    """The campaign is not in the store; ``known`` lists those that are."""

    def __init__(self, campaign_id: str, known: list[str]) -> None:
        self.campaign_id, self.known = campaign_id, known
        super().__init__(f"unknown campaign {campaign_id!r}; known campaigns: {', '.join(known) or '(none)'}")


class CampaignSpecMismatch(StoreError):
    """A campaign id is reused with a spec different from the stored one."""


class RunStateError(StoreError):
    """A run is unknown, or not in the state an operation needs (e.g. saving a done run again)."""


class RunRow(NamedTuple):
    """The store's view of one planned run."""

    run_key: str
    status: str
    """``pending``, ``running``, ``done`` or ``failed``."""
    attempts: int
    """How many times the run was marked running."""


#: The database layout as a sequence of migrations: entry ``v`` brings a file from version ``v - 1``
#: to ``v`` (version 0 = a new file). A file is migrated step by step, in one transaction per step,
#: when it is opened; a layout change is a new entry here, never an edit of an old one (files in
#: the field are at every version). Version 2 adds no table: it marks that ``runs.record`` may hold
#: :class:`RunRecord` schema 2, so that an older anibench refuses the file in one line instead of
#: failing on the first new record. Version 3 adds the columns ``agent_error`` and
#: ``agent_exit_status`` (copies of the record's fields, so that ``SELECT ... WHERE agent_error IS NOT
#: NULL`` finds the runs whose agent failed; NULL in runs stored before). Version 4 adds ``reconciles``,
#: ``drift_events`` and ``supervisor_restarts`` (copies of the record's fields: A3-R and A4 runs'
#: reconcile attempts, drift events and reconciler restarts; NULL at the other levels), filled for
#: the runs stored before from their records (``supervisor_restarts`` stays NULL: they lack it).
#: Version 5 adds ``dataplane`` (a copy of the record's field; ``kernel`` for the runs stored before,
#: whose records lack it: the only data plane there was).
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE IF NOT EXISTS campaigns (
            campaign_id TEXT PRIMARY KEY,
            spec        TEXT NOT NULL,
            created_at  TEXT NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS runs (
            seq         INTEGER PRIMARY KEY,
            run_key     TEXT NOT NULL UNIQUE,
            campaign_id TEXT NOT NULL REFERENCES campaigns(campaign_id),
            status      TEXT NOT NULL CHECK (status IN ('pending', 'running', 'done', 'failed')),
            attempts    INTEGER NOT NULL DEFAULT 0,
            record      TEXT,
            updated_at  TEXT NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS runs_by_status ON runs (campaign_id, status, seq)",
    ),
    2: (),
    3: (
        "ALTER TABLE runs ADD COLUMN agent_error TEXT",
        "ALTER TABLE runs ADD COLUMN agent_exit_status INTEGER",
    ),
    4: (
        "ALTER TABLE runs ADD COLUMN reconciles INTEGER",
        "ALTER TABLE runs ADD COLUMN drift_events INTEGER",
        "ALTER TABLE runs ADD COLUMN supervisor_restarts INTEGER",
        "UPDATE runs SET reconciles = json_extract(record, '$.reconciles'), drift_events = json_extract(record, "
        "'$.drift_events'), supervisor_restarts = json_extract(record, '$.supervisor_restarts') "
        "WHERE record IS NOT NULL AND json_valid(record)",
    ),
    5: (
        "ALTER TABLE runs ADD COLUMN dataplane TEXT",
        "UPDATE runs SET dataplane = coalesce(json_extract(record, '$.dataplane'), 'kernel') "
        "WHERE record IS NOT NULL AND json_valid(record)",
    ),
}
assert sorted(_MIGRATIONS) == list(range(1, DB_VERSION + 1)), "one migration per version, none missing"


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _canonical(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


class CampaignStore:
    """Campaigns and runs in one SQLite file; every write is committed before the call returns.

    Use as a context manager (or call :meth:`close`). Several processes may open the same file
    (WAL, busy timeout); :meth:`recover` must only be called when no runner of the campaign is alive.

    Args:
        path: The SQLite file; created with its parent directories if missing.

    Raises:
        StoreError: The file was written by a newer version of the store.
        sqlite3.Error: The file is not a usable SQLite database.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > DB_VERSION:
                raise StoreError(f"{self.path} has store version {version}; this anibench reads up to {DB_VERSION}")
            for step in range(version + 1, DB_VERSION + 1):
                with self._tx() as db:
                    for statement in _MIGRATIONS[step]:
                        db.execute(statement)
                    db.execute(f"PRAGMA user_version = {step}")
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._db.close()

    def __enter__(self) -> CampaignStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any exception)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # --- campaigns ---------------------------------------------------------------------------

    def campaigns(self) -> list[str]:
        """The ids of all campaigns, in creation order."""
        return [r[0] for r in self._db.execute("SELECT campaign_id FROM campaigns ORDER BY rowid")]

    def create_campaign(self, campaign_id: str, spec: dict[str, Any]) -> bool:
        """Create a campaign, or accept resuming it with the same spec.

        Args:
            campaign_id: The campaign's id.
            spec: The campaign's options (JSON-serializable); compared key-order-insensitively.

        Returns:
            True if the campaign was created, False if it existed with the same spec (resume).

        Raises:
            CampaignSpecMismatch: The id exists with a different spec.
            TypeError: ``spec`` is not JSON-serializable.
        """
        text = _canonical(spec)
        with self._tx() as db:
            row = db.execute("SELECT spec FROM campaigns WHERE campaign_id = ?", (campaign_id,)).fetchone()
            if row is None:
                db.execute("INSERT INTO campaigns VALUES (?, ?, ?)", (campaign_id, text, _now()))
                return True
        if row[0] != text:
            raise CampaignSpecMismatch(
                f"campaign {campaign_id!r} exists with a different spec; use a new id (stored spec: {row[0]})")
        return False

    def campaign_spec(self, campaign_id: str) -> dict[str, Any]:
        """The stored spec of a campaign.

        Raises:
            UnknownCampaign: No such campaign.
        """
        row = self._db.execute("SELECT spec FROM campaigns WHERE campaign_id = ?", (campaign_id,)).fetchone()
        if row is None:
            raise UnknownCampaign(campaign_id, self.campaigns())
        spec: dict[str, Any] = json.loads(row[0])
        return spec

    def _require(self, campaign_id: str) -> None:
        self.campaign_spec(campaign_id)

    # --- runs --------------------------------------------------------------------------------

    def plan(self, campaign_id: str, run_keys: Iterable[str]) -> int:
        """Insert pending runs; keys already planned (in any state) are left as they are.

        Args:
            campaign_id: The campaign.
            run_keys: The runs' keys (see :func:`run_key`), in the order to run them.

        Returns:
            How many runs were newly planned.

        Raises:
            UnknownCampaign: No such campaign.
            RunStateError: A key already belongs to another campaign.
        """
        self._require(campaign_id)
        added = 0
        with self._tx() as db:
            for key in run_keys:
                cur = db.execute(
                    "INSERT OR IGNORE INTO runs (run_key, campaign_id, status, updated_at) VALUES (?, ?, 'pending', ?)",
                    (key, campaign_id, _now()))
                if cur.rowcount:
                    added += 1
                    continue
                owner = db.execute("SELECT campaign_id FROM runs WHERE run_key = ?", (key,)).fetchone()[0]
                if owner != campaign_id:
                    raise RunStateError(f"run {key!r} belongs to campaign {owner!r}, not {campaign_id!r}")
        return added

    def recover(self, campaign_id: str | None = None) -> list[str]:
        """Put runs left ``running`` by a crash back to ``pending``, so that they are redone once.

        Call it when resuming, while no runner of the campaign is alive.

        Args:
            campaign_id: Only this campaign; all campaigns if None.

        Returns:
            The keys put back to pending.
        """
        with self._tx() as db:
            keys = self._keys("running", campaign_id)
            db.executemany("UPDATE runs SET status = 'pending', updated_at = ? WHERE run_key = ?",
                           [(_now(), k) for k in keys])
        return keys

    def release(self, run_keys: Iterable[str]) -> list[str]:
        """Put the given runs back to ``pending`` if they are ``running`` (their runner was lost,
        e.g. a cluster worker that died mid-variant), so that they are redone once; done and failed
        runs are left as they are, so no stored run is redone.

        Returns:
            The keys put back to pending.
        """
        with self._tx() as db:
            back = [k for k in run_keys if self._status(k) == "running"]
            db.executemany("UPDATE runs SET status = 'pending', updated_at = ? WHERE run_key = ? AND status = 'running'",
                           [(_now(), k) for k in back])
        return back

    def _keys(self, status: str, campaign_id: str | None, limit: int = -1) -> list[str]:
        where, args = ("AND campaign_id = ?", (campaign_id,)) if campaign_id is not None else ("", ())
        sql = f"SELECT run_key FROM runs WHERE status = ? {where} ORDER BY seq LIMIT ?"
        return [r[0] for r in self._db.execute(sql, (status, *args, limit))]

    def pending_runs(self, campaign_id: str | None = None) -> list[str]:
        """Keys of the pending runs, in planned order (of one campaign, or of all if None)."""
        return self._keys("pending", campaign_id)

    def next_pending(self, campaign_id: str | None = None) -> str | None:
        """The first pending run in planned order, or None when none is left."""
        keys = self._keys("pending", campaign_id, limit=1)
        return keys[0] if keys else None

    def mark_running(self, run_key: str) -> None:
        """Mark a pending run as running (and count the attempt).

        Raises:
            RunStateError: The run is unknown or not pending (already running, done or failed; for
                concurrent runners this means another runner took it).
        """
        with self._tx() as db:
            cur = db.execute(
                "UPDATE runs SET status = 'running', attempts = attempts + 1, updated_at = ? "
                "WHERE run_key = ? AND status = 'pending'", (_now(), run_key))
            if cur.rowcount == 0:
                raise RunStateError(f"run {run_key!r} is {self._status(run_key) or 'unknown'}, not pending")

    def save_result(self, record: RunRecord) -> None:
        """Store a run's record and its final status (done or failed) in one transaction.

        Raises:
            RunStateError: The run is unknown, belongs to another campaign, or is not running (a
                done run is never saved twice).
        """
        with self._tx() as db:
            cur = db.execute(
                "UPDATE runs SET status = ?, record = ?, agent_error = ?, agent_exit_status = ?, reconciles = ?, "
                "drift_events = ?, supervisor_restarts = ?, dataplane = ?, updated_at = ? "
                "WHERE run_key = ? AND campaign_id = ? AND status = 'running'",
                (record.status.value, record.model_dump_json(), record.agent_error, record.agent_exit_status,
                 record.reconciles, record.drift_events, record.supervisor_restarts, record.dataplane, _now(),
                 record.run_key, record.campaign_id))  # fmt: skip
            if cur.rowcount == 0:
                raise RunStateError(
                    f"cannot save run {record.run_key!r} of campaign {record.campaign_id!r}: "
                    f"it is {self._status(record.run_key) or 'unknown'}, not running")

    def _status(self, run_key: str) -> str | None:
        row = self._db.execute("SELECT status FROM runs WHERE run_key = ?", (run_key,)).fetchone()
        return row[0] if row else None

    def rows(self, campaign_id: str) -> list[RunRow]:
        """Every planned run of a campaign with its status and attempts, in planned order.

        Raises:
            UnknownCampaign: No such campaign.
        """
        self._require(campaign_id)
        return [RunRow(*r) for r in self._db.execute(
            "SELECT run_key, status, attempts FROM runs WHERE campaign_id = ? ORDER BY seq", (campaign_id,))]

    def runs(self, campaign_id: str) -> list[RunRecord]:
        """The records of a campaign's finished runs (done and failed), in planned order.

        Raises:
            UnknownCampaign: No such campaign.
            pydantic.ValidationError: A stored record does not match the current schema.
        """
        self._require(campaign_id)
        return [RunRecord.model_validate_json(r[0]) for r in self._db.execute(
            "SELECT record FROM runs WHERE campaign_id = ? AND status IN ('done', 'failed') ORDER BY seq",
            (campaign_id,))]
