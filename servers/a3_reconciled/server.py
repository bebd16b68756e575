"""ANI level A3-R: a reconciled source of truth (draft section 5.1, Table 1: "versioned desired
state, drift detection and reconciliation"). The agent edits desired state, never devices: what
reaches the network is only what the reconciler (:mod:`servers.a3_reconciled.reconciler`) applies
from a commit, through the A3-T planner and transaction.

Tools (every one counts as a step; budget, ``submit`` and the trajectory come from :mod:`servers.common`):

- ``list_records(service_class)``, ``read_record(service_class, id)``: the records of the working
  tree (one YAML file per record, :mod:`servers.a3_reconciled.source`);
- ``write_record``, ``patch_record`` (RFC 7396 merge patch), ``delete_record``: change the
  working tree; a record that does not validate against the A3-T spec model is refused with its
  field paths and nothing is written;
- ``diff``: the working change against HEAD; ``discard``: drop it;
- ``commit(message)``: validates every record and plans the whole desired state with the A3-T
  planner (references, allocation, integrity): a refused change is not committed; else commits
  and wakes the reconciler;
- ``reconcile_status``, ``history``, ``revert(commit)``, ``wait(seconds)``.

The server starts the lab's reconciler (one per lab) and stops it when it closes.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, ConfigDict, Field

from servers.a3_intent import catalog as cat
from servers.a3_intent.catalog import ChangeSetRejected, Problem, natural_key, parse_ops
from servers.a3_intent.transaction import Engine, EngineOptions
from servers.a3_reconciled import reconciler as rc
from servers.a3_reconciled.source import (
    ResetInProgress,
    RecordRejected, Repo, SourceError, blame, check_id, check_message, desired_of, load_record, normalize, ops_toward,
    record_path, writable_classes,
)  # fmt: skip
from servers.common import AniServer, ServerConfig, ServerSetupError, level_options
from servers.common.server import ResultNote
from substrate.errors import SubstrateError

log = logging.getLogger("anibench.servers.a3r")

LEVEL = "A3-R"
INSTRUCTIONS = (
    "A3-R: you edit the network's desired state -- service records in a Git repository, one YAML file per record "
    "(records/<service_class>/<id>.yaml, the spec of the typed service catalog) -- never the devices. Change records "
    "(write_record, patch_record, delete_record), look at the working change (diff), then commit it with a message: "
    "the commit is validated (schema, references, resources) and refused with the field paths when invalid. A "
    "reconciler then drives the network to the commit through a transaction with active validation; call wait or "
    "reconcile_status to see it applied (or why not). It also reverts changes made on the devices outside the "
    "records (drift). history and revert give the earlier commits. Call submit when done."
)
#: Most characters of a diff returned whole.
MAX_DIFF_CHARS = 12_000
#: Bound on one wait (seconds).
MAX_WAIT_S = 120.0


class A3ROptions(BaseModel):
    """Level-specific options of A3-R (``ServerConfig.options``)."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(default=rc.DEFAULT_INTERVAL_S, gt=0, le=3600, description="Reconcile period (seconds).")
    mode: rc.Mode = Field(default="revert", description="Drift: 'revert' (self-heal, default) or 'report' (report only).")
    lock_timeout_s: float = Field(default=5.0, ge=0, le=120)
    capture_timeout_s: float = Field(default=8.0, gt=0, le=60)
    device_timeout_s: float = Field(default=20.0, gt=0, le=120)
    reconciler: bool = Field(default=True, description="Start the lab's reconciler with the server (tests start their own).")
    max_restarts: int = Field(default=rc.MAX_RESTARTS, ge=0, le=100, description="Restarts of a dead reconciler at most.")
    stop_timeout_s: float = Field(default=rc.STOP_TIMEOUT_S, gt=0, le=900, description="Bound on the wait, at submit and at "
                                  "close, for the reconciler's (or an apply's) in-flight transaction to finish (seconds).")


ClassName = Annotated[str, Field(max_length=64, description="Service class, e.g. 'tenant_site' (see list_records).")]
RecordId = Annotated[str, Field(max_length=64, description="Record (instance) id, e.g. 't3s4'.")]


class RecordList(BaseModel):
    classes: dict[str, list[str]] = Field(description="Service class -> record ids in the working tree.")
    changed: list[str] = Field(description="Working change against HEAD ('M path', 'A path', 'D path').")
    head: str | None
    spec_schemas: dict[str, Any] = Field(default_factory=dict, description="JSON Schema of each class's record (when asked for one class).")


class RecordView(BaseModel):
    path: str
    service_class: str
    id: str
    spec: dict[str, Any]
    text: str = Field(description="The file as stored (YAML).")
    in_head: bool = Field(description="Whether HEAD has this record with this content.")


class WriteResult(BaseModel):
    path: str
    action: str = Field(description="written | deleted | unchanged")
    spec: dict[str, Any] | None = None
    changed: list[str] = Field(description="The whole working change against HEAD.")
    message: str


class DiffResult(BaseModel):
    changed: list[str]
    diff: str
    truncated: bool = False


class CommitResult(BaseModel):
    commit: str
    message: str
    files: list[str]
    devices_to_change: list[str] = Field(default_factory=list, description="What the A3-T planner says the reconcile will touch.")
    next_step: str


class StatusResult(BaseModel):
    head: str | None
    applied_commit: str | None = Field(description="Last commit the network carries.")
    in_sync: bool = Field(description="The reconciler runs, HEAD is applied and the last reconcile found no drift left unreverted.")
    failed_commit: str | None = None
    failed_message: str | None = None
    reconciler_running: bool
    mode: str
    reconciles: int
    drift_events: int
    recent: list[dict[str, Any]] = Field(description="Last reconciles, newest first (commit, result, devices, drift, duration).")
    restarts: int = Field(default=0, description="Times the reconciler died and was restarted by its supervisor (this server).")
    reconciler_down: rc.ReconcilerDown | None = Field(default=None, description="Set while the supervised reconciler is "
                                                      "down: since when, why, restarts so far, whether it is restarted, "
                                                      "and how to recover (every tool result carries it then).")
    summary: str = Field(default="", description="In words: the repository (HEAD) and the devices (reconciled to HEAD, "
                         "pending, failed with the device and command, drift reported, or no reconciler running).")
    reset_notice: str | None = Field(default=None, description="Set when the lab was reset to its baseline and the repository "
                                     "made again from it: when, and the commits and working change that went with the old one.")


class HistoryResult(BaseModel):
    commits: list[dict[str, Any]]
    total: int


def _merge(base: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(base) if isinstance(base, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


def _problems(e: RecordRejected | ChangeSetRejected, what: str) -> ToolError:
    lines = [f"- {p}" for p in e.problems[:40]] + ([f"- ... {len(e.problems) - 40} more"] if len(e.problems) > 40 else [])
    return ToolError(f"{what}:\n" + "\n".join(lines))


def start_reconciler(server: AniServer, opts: A3ROptions, engine: Engine) -> None:
    """Start the lab's reconciler process (unless ``opts.reconciler`` is false) over the server's
    devices; at ``submit`` and when the server closes, wait (bounded by ``opts.stop_timeout_s``)
    for the transaction in flight to finish and stop the reconciler (:func:`settle`) (A3-R and A4).

    Raises:
        ServerSetupError: it did not start.
    """
    lab_ = server.lab
    sup: rc.Supervisor | None = None
    if opts.reconciler:
        def start() -> int:
            return rc.start(lab_, interval_s=opts.interval_s, mode=opts.mode,
                            devices=None if server.config.devices == "all" else sorted(server.device_names),
                            options={"lock_timeout_s": opts.lock_timeout_s, "capture_timeout_s": opts.capture_timeout_s,
                                     "device_timeout_s": opts.device_timeout_s})  # fmt: skip

        sup = rc.Supervisor(lab_, start, max_restarts=opts.max_restarts)
        try:
            sup.begin()
        except SubstrateError as e:
            raise ServerSetupError(str(e)) from None
        server.result_notes.append(lambda: down_note(sup.notice()))
    repo = Repo(lab_)

    def final() -> str:
        if sup is not None:
            sup.close()  # the stop that follows is not a death to restart
        return settle(engine, repo, opts.stop_timeout_s, stop_reconciler=sup is not None)

    server.on_submit.append(final)
    server.on_close.append(lambda: log.info("A3-R close: %s", final()))


def down_note(notice: rc.ReconcilerDown | None) -> ResultNote | None:
    """The result note (key ``reconciler_down``) of a "reconciler down" notice (:func:`rc.down_notice`), or None."""
    if notice is None:
        return None
    return ResultNote(key="reconciler_down", data=notice.model_dump(mode="json"), text=notice.message)


def settle(engine: Engine, repo: Repo, timeout_s: float, *, stop_reconciler: bool = True) -> str:
    """Make the network final for evaluation (``submit``, server close): stop the lab's reconciler
    (when ``stop_reconciler``: the server started it) after its in-flight reconcile
    (:func:`servers.a3_reconciled.reconciler.stop`, bounded), then wait
    for any other transaction in flight (an A4 apply in another thread or process holds the A3-T
    transaction lock) within what is left of ``timeout_s`` and finish or undo any journaled
    transaction left unfinished. Never raises for a device or lock problem.

    Returns:
        What was done and where the network stands: the repository's HEAD, the commit the devices
        carry, and whether a transaction could not be finished within the bound (then the network
        may be evaluated with it half-applied, and the sentence says so).
    """
    from substrate.locks import ConfigLockHeld

    t0 = time.monotonic()
    out = []
    if stop_reconciler:
        rep = rc.stop(repo.lab, timeout_s=timeout_s, options=engine.opts)
        said = rep.describe()
        out.append(said[:1].upper() + said[1:] + ".")
    left = max(0.0, timeout_s - (time.monotonic() - t0))
    try:
        with engine.records.transaction_lock(f"{engine.opts.holder}: submit", left):
            notes = engine.recover() if engine.journal.unfinished() else []
            open_ = [e.txn for e in engine.journal.unfinished()]
        out += [f"Recovered: {n}." for n in notes]
        if open_:
            out.append(f"Change {', '.join(open_)} is still unfinished (a device did not answer): the network is evaluated "
                       "with it half-applied.")
    except ConfigLockHeld as e:
        out.append(f"A transaction was still running after {timeout_s:g} s ({e}): the network is evaluated while it runs.")
    except (SubstrateError, OSError) as e:
        out.append(f"Unfinished transactions could not be checked: {e}.")
    try:
        st = rc.read_status(repo.lab, engine.records.epoch())
        head = repo.head()
    except (SubstrateError, SourceError, OSError) as e:
        out.append(f"The source of truth could not be read: {e}.")
        return " ".join(out)
    if head is not None and st.applied_commit == head:
        out.append(f"The devices carry HEAD (commit {head[:12]}).")
    else:
        out.append(f"The devices carry commit {(st.applied_commit or 'none')[:12]}, not HEAD {(head or 'none')[:12]}"
                   + (f" (HEAD failed to apply: {st.failed_message[:300]})" if st.failed_commit == head and st.failed_message else
                      " (not reconciled yet)") + ".")  # fmt: skip
    return " ".join(out)


def status_of(engine: Engine, repo: Repo) -> StatusResult:
    """Where the lab's network stands against its source of truth (reconcile_status of A3-R and A4)."""
    lab_ = repo.lab
    epoch = engine.records.epoch()
    if repo.epoch() != epoch:  # the lab was reset: the repository of the old epoch goes now, and the notice says what went
        with repo.locked():
            repo.ensure(engine.inventory()[0], epoch)
    st = rc.read_status(lab_, epoch)
    head = repo.head()
    recent = [r.model_dump(mode="json") for r in rc.read_log(lab_, epoch, 5)]
    last = st.last
    running = rc.controllers.info(lab_.dir, rc.CONTROLLER) is not None
    sup = rc.read_supervisor(lab_)
    down = rc.down_notice(lab_, sup, running=running)
    # no reconciler: nothing watches the devices, so the last record says nothing of now
    in_sync = running and head is not None and st.applied_commit == head and last is not None and (
        not last.drift or last.result == "drift_reverted") and last.result != "retry"
    notice = reset_notice(repo.discarded(epoch))
    return StatusResult(head=head, applied_commit=st.applied_commit, in_sync=in_sync, failed_commit=st.failed_commit,
                        failed_message=st.failed_message, reconciler_running=running,
                        mode=st.mode, reconciles=st.reconciles, drift_events=st.drift_events, recent=recent,
                        restarts=sup.restarts if sup else 0, reconciler_down=down, reset_notice=notice,
                        summary=summary_of(st, head, running, in_sync, down) + (f" {notice}" if notice else ""))  # fmt: skip


def reset_notice(note: dict[str, Any] | None) -> str | None:
    """What :meth:`~servers.a3_reconciled.source.Repo.discarded` says, in words (None for nothing discarded)."""
    if not note:
        return None
    named = ", ".join(f"{c['commit'][:12]} ({c['subject'][:60]})" for c in note.get("commits", [])[:5])
    more = f" and {note['count'] - 5} more" if note.get("count", 0) > 5 else ""
    gone = [f"{note['count']} commit(s) after the baseline commit: {named}{more}"] if note.get("count") else []
    gone += ["the working change (uncommitted edits)"] if note.get("working_change") else []
    return (f"The lab was reset to its baseline at {time.strftime('%H:%M:%S', time.localtime(note['at']))} and the repository was "
            f"made again from it; gone with the old repository: {'; '.join(gone)}.")  # fmt: skip


def not_running(down: rc.ReconcilerDown | None) -> str:
    """What a missing reconciler means, in words (reconcile_status's summary, commit's next step):
    the "down" notice's message when a supervised one died, else that none was started."""
    return down.message if down is not None else "No reconciler is running, so nothing applies commits or reverts drift now (restart the server)."


def summary_of(st: rc.ReconcileStatus, head: str | None, running: bool, in_sync: bool, down: rc.ReconcilerDown | None = None) -> str:
    """reconcile_status in words: what the repository holds and what the devices carry."""
    repo_ = f"repository: HEAD is commit {head[:12]}" if head else "repository: no commit yet"
    applied = (st.applied_commit or "none")[:12]
    last = st.last
    if head is not None and st.failed_commit == head:
        dev = f"devices: failed -- HEAD was not applied, they stay at commit {applied}: {st.failed_message or 'no reason recorded'}"
    elif head is not None and st.applied_commit == head and in_sync:
        dev = "devices: reconciled -- they carry HEAD" + (" (drift found was reverted)" if last and last.result == "drift_reverted" else "")
    elif head is not None and st.applied_commit == head and last is not None and last.drift and last.result != "drift_reverted":
        dev = (f"devices: HEAD applied, but drift on {', '.join(sorted(last.drift))} is "
               + ("reported, not reverted (report-only mode)" if last.result == "drift_reported" else f"not reverted: {last.message}"))
    elif head is not None and st.applied_commit == head:
        # applied, but nothing watches the devices now (no reconciler) or the last reconcile is to be retried
        dev = "devices: HEAD was applied" + (f"; the last reconcile is to be retried: {last.message}" if last is not None
                                              and last.result == "retry" else "; nothing checks them for drift while no reconciler runs")  # fmt: skip
    else:
        dev = f"devices: pending -- HEAD is not applied yet (they carry commit {applied})" + (
            f"; the last reconcile is to be retried: {last.message}" if last is not None and last.result == "retry" else "")
    return f"{repo_}; {dev}." + (f" {not_running(down)}" if not running else "")


def history_of(repo: Repo, limit: int, skip: int) -> HistoryResult:
    """The source of truth's commits, newest first (history of A3-R and A4).

    Raises:
        ToolError: git failed.
    """
    try:
        return HistoryResult(commits=repo.log(limit, skip), total=repo.count())
    except SourceError as e:
        raise ToolError(str(e)) from None


def build_server(config: ServerConfig, *, lab: object = None) -> AniServer:  # noqa: C901
    """The A3-R server over ``config.lab`` (a lab deployed from a scenario); starts the lab's reconciler.

    Raises:
        ServerSetupError: bad options, lab missing or not deployed from a scenario, reconciler not starting.
    """
    opts = level_options(A3ROptions, config, LEVEL)
    server = AniServer(config, level=LEVEL, instructions=INSTRUCTIONS, lab=lab)
    lab_ = server.lab
    eopts = EngineOptions(lock_timeout_s=opts.lock_timeout_s, capture_timeout_s=opts.capture_timeout_s,
                          device_timeout_s=opts.device_timeout_s, holder=f"A3-R server (pid {os.getpid()})")  # fmt: skip
    engine = Engine(lab_, eopts)
    try:
        engine.records.base_scenario()
    except SubstrateError as e:
        raise ServerSetupError(f"A3-R needs a lab deployed from a scenario: {e}") from None
    repo = Repo(lab_)
    allowed = set(server.device_names)
    author = (f"agent ({config.run_id})" if config.run_id else "agent", "agent@lab.invalid")

    def ensure() -> bool:
        with repo.locked():
            sc, _ = engine.inventory()
            return repo.ensure(sc, engine.records.epoch())

    try:
        ensure()
    except SourceError as e:
        raise ServerSetupError(f"A3-R: cannot make the source-of-truth repository: {e}") from None
    start_reconciler(server, opts, engine)
    classes = writable_classes(engine.records.base_scenario())

    def known_class(name: str) -> str:
        if name not in classes:
            raise ToolError(f"unknown service class {name[:64]!r}; classes: {', '.join(classes)}")
        return name

    def checked_id(cls: str, iid: str, outcome: str = "nothing was written") -> str:
        try:
            return check_id(cls, iid)
        except RecordRejected as e:
            raise _problems(e, f"record rejected; {outcome}") from None

    def git_error(e: SourceError) -> ToolError:
        return ToolError(f"{e}; nothing was changed")

    # -- reading ------------------------------------------------------------------------------------------

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="List records")
    def list_records(
        service_class: Annotated[str | None, Field(max_length=64, description="Only this class (its record JSON Schema is "
                                                                              "returned too); all classes when left out.")] = None,
    ) -> RecordList:
        """The records of the working tree per service class (ids), the working change against HEAD, and HEAD's commit id.
        With a service_class, also the JSON Schema of that class's record (the spec the YAML file holds)."""
        with repo.locked():
            ensure()
            desired, _problems_ = repo.working()
            changed = repo.status()
            head = repo.head()
        names = [known_class(service_class)] if service_class else classes
        out = {n: sorted(desired.get(n, {}), key=natural_key) for n in names}
        schemas = {service_class: cat.spec_schema(service_class)} if service_class else {}
        return RecordList(classes=out, changed=changed, head=head, spec_schemas=schemas)

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="Read a record")
    def read_record(service_class: ClassName, id: RecordId) -> RecordView:  # noqa: A002
        """One record of the working tree: its file path, spec and text, and whether HEAD holds the same."""
        cls = known_class(service_class)
        iid = checked_id(cls, id, "no record was read")
        with repo.locked():
            text = repo.read(cls, iid)
            if text is None:
                ids = sorted(repo.working()[0].get(cls, {}), key=natural_key)
                raise ToolError(f"no {cls} record {iid!r}; records: {', '.join(ids[:40]) or 'none'}")
            try:
                head = repo.desired_at("HEAD").get(cls, {}).get(iid)
            except SourceError:
                head = None

        try:
            spec = normalize(cls, load_record(text))
        except RecordRejected as e:
            raise ToolError(f"{record_path(cls, iid)} does not validate: {e}") from None
        return RecordView(path=record_path(cls, iid), service_class=cls, id=iid, spec=spec, text=text,
                          in_head=head is not None and normalize(cls, head) == spec)  # fmt: skip

    # -- the working change -------------------------------------------------------------------------------

    def _write(cls: str, iid: str, spec: dict[str, Any]) -> WriteResult:
        with repo.locked():
            ensure()
            path = repo.write(cls, iid, spec)
            changed = repo.status()
        return WriteResult(path=path, action="written", spec=spec, changed=changed,
                           message="written to the working tree (nothing reaches the network before commit)")  # fmt: skip

    @server.ani_tool(kind="config", read_only=False, idempotent=True, title="Write a record")
    def write_record(
        service_class: ClassName,
        id: RecordId,  # noqa: A002
        spec: Annotated[dict[str, Any], Field(description="The record's full spec (the class's create spec, see "
                                                          "list_records(service_class)), e.g. {\"tenant\": \"t3\", \"pe\": \"r2\", "
                                                          "\"pe_interface\": \"eth5\", \"prefix6\": \"fd10:0:0:9::/64\"}.")],
    ) -> WriteResult:
        """Create or replace a record in the working tree. It is validated against its class's spec model first: an invalid
        record is an error naming each field path (e.g. spec.prefix6) and nothing is written. Nothing reaches the network
        before commit."""
        cls = known_class(service_class)
        iid = checked_id(cls, id)
        try:
            norm = normalize(cls, spec)
        except RecordRejected as e:
            raise _problems(e, f"record {record_path(cls, iid)} rejected; nothing was written") from None
        return _write(cls, iid, norm)

    @server.ani_tool(kind="config", read_only=False, idempotent=True, title="Patch a record")
    def patch_record(
        service_class: ClassName,
        id: RecordId,  # noqa: A002
        patch: Annotated[dict[str, Any], Field(description="RFC 7396 merge patch of the spec: fields given replace, "
                                                           "null removes an optional one, e.g. {\"pe\": \"r6\", \"pe_interface\": \"eth4\"}.")],
    ) -> WriteResult:
        """Change some fields of an existing record in the working tree (merge patch); the result is validated as
        write_record's (field paths on error, nothing written)."""

        cls = known_class(service_class)
        iid = checked_id(cls, id)
        with repo.locked():
            text = repo.read(cls, iid)
        if text is None:
            raise ToolError(f"no {cls} record {iid!r} to patch (write_record creates one)")
        try:
            norm = normalize(cls, _merge(load_record(text) or {}, patch))
        except RecordRejected as e:
            raise _problems(e, f"record {record_path(cls, iid)} rejected; nothing was written") from None
        return _write(cls, iid, norm)

    @server.ani_tool(kind="config", read_only=False, destructive=True, idempotent=True, title="Delete a record")
    def delete_record(service_class: ClassName, id: RecordId) -> WriteResult:  # noqa: A002
        """Remove a record from the working tree (the instance goes from the network once committed and reconciled)."""
        cls = known_class(service_class)
        iid = checked_id(cls, id)
        with repo.locked():
            existed = repo.delete(cls, iid)
            changed = repo.status()
        return WriteResult(path=record_path(cls, iid), action="deleted" if existed else "unchanged", changed=changed,
                           message="deleted from the working tree" if existed else f"there was no {cls} record {iid!r}")  # fmt: skip

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="Diff against HEAD")
    def diff() -> DiffResult:
        """The working change against HEAD: changed files and the unified diff."""
        with repo.locked():
            changed, text = repo.status(), repo.diff()
        cut = len(text) > MAX_DIFF_CHARS
        return DiffResult(changed=changed, diff=text[:MAX_DIFF_CHARS] + (f"\n... {len(text) - MAX_DIFF_CHARS} more characters" if cut else ""),
                          truncated=cut)  # fmt: skip

    @server.ani_tool(kind="config", read_only=False, idempotent=True, title="Discard the working change")
    def discard() -> DiffResult:
        """Put the working tree back to HEAD (the working change is lost)."""
        with repo.locked():
            repo.discard()
            return DiffResult(changed=repo.status(), diff="")

    def _check(desired: dict[str, Any]) -> list[str]:
        """Plan the whole desired state against the applied records with the A3-T planner; the devices it touches.

        Raises:
            ToolError: refused (problems addressed to record files).
        """
        sc, _ = engine.inventory()
        raw, where = ops_toward(desired, desired_of(sc))
        if not raw:
            return []
        try:
            pl = engine.plan(parse_ops(raw), allowed=allowed)
        except ChangeSetRejected as e:
            raise _problems(ChangeSetRejected(blame(e.problems, where)), "commit refused by validation; nothing was committed") from None
        return [d.device for d in pl.devices]

    def _commit(message: str) -> CommitResult:
        try:
            check_message(message)
        except RecordRejected as e:
            raise _problems(e, "commit refused: the message is not plain text; nothing was committed") from None
        try:
            return _commit_held(message)
        except ResetInProgress as e:
            raise ToolError(f"{e}; nothing was committed") from None

    def _commit_held(message: str) -> CommitResult:
        with repo.committing():
            if ensure():
                raise ToolError("the lab was reset to its baseline since the records were last read: the repository was made "
                                "again from the baseline and the working change went with it; nothing was committed. Read "
                                "the records (list_records) and make the change again.")  # fmt: skip
            desired, bad = repo.working()
            if bad:
                raise _problems(RecordRejected(bad), "commit refused: records do not validate; nothing was committed")
            files = repo.status()
            if not files:
                raise ToolError("nothing to commit: the working tree equals HEAD")
            devices = _check(desired)
            try:
                cid = repo.commit(message, author)
            except SourceError as e:
                raise git_error(e) from None
        woken = rc.wake(lab_)
        step = ("committed to the repository; the devices are pending: the reconciler applies it now (call wait or "
                "reconcile_status to see it applied or why not)" if woken else
                "committed to the repository, but the lab's reconciler is not running: nothing applies it to the devices "
                "until one runs. " + not_running(rc.down_notice(lab_, rc.read_supervisor(lab_), running=False)))  # fmt: skip
        return CommitResult(commit=cid, message=message, files=files, devices_to_change=devices, next_step=step)

    @server.ani_tool(kind="config", read_only=False, destructive=True, title="Commit")
    def commit(
        message: Annotated[str, Field(min_length=1, max_length=2000, description="Commit message: what and why.")],
    ) -> CommitResult:
        """Commit the working change. First every record is validated and the whole desired state is planned by the typed
        planner (references, free circuits, pools, integrity): a refusal is an error naming each record file and field,
        and nothing is committed. A commit wakes the reconciler, which applies it to the devices as one transaction with
        active validation (a failing change is rolled back on the devices and reported in reconcile_status)."""
        return _commit(message)

    # -- status, history, revert, wait ----------------------------------------------------------------------

    def _status() -> StatusResult:
        return status_of(engine, repo)

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="Reconcile status")
    def reconcile_status() -> StatusResult:
        """Where the network stands: HEAD, the last applied commit, a commit that failed to apply and why, and the last
        reconciles (commit, result, devices touched, drift found per device, duration)."""
        return _status()

    @server.ani_tool(kind="read", read_only=True, idempotent=True, title="History")
    def history(
        limit: Annotated[int, Field(ge=1, le=100, description="Commits to return (newest first).")] = 20,
        skip: Annotated[int, Field(ge=0, le=100_000, description="Newest commits to skip.")] = 0,
    ) -> HistoryResult:
        """The commits (newest first): id, author, time, message, files changed."""
        return history_of(repo, limit, skip)

    @server.ani_tool(kind="config", read_only=False, destructive=True, title="Revert to a commit")
    def revert(
        commit: Annotated[str, Field(min_length=4, max_length=64, description="Commit id (or unique prefix) whose records to restore.")],
        message: Annotated[str | None, Field(max_length=2000, description="Commit message (default: 'revert to <commit>').")] = None,
    ) -> CommitResult:
        """Make the records those of an earlier commit, as a new commit (the history is kept), validated as commit is;
        the reconciler then drives the network there. A working change not committed is replaced."""
        try:
            check_message(message or "")
            full = repo.resolve(commit.strip())
        except RecordRejected as e:
            raise _problems(e, "revert refused: the message is not plain text; nothing was changed") from None
        except SourceError as e:
            raise ToolError(str(e)) from None
        # one hold of the repository lock from the checkout to the commit (re-entrant in this thread):
        # another client's write between them went into the revert commit, and its discard emptied it
        # (issue 35, two clients at once)
        with repo.locked():
            repo.discard()
            repo.checkout_tree(full)
            if not repo.status():
                raise ToolError(f"HEAD already has the records of {full[:12]}; nothing to revert")
            try:
                return _commit(message or f"revert to {full[:12]}")
            except ToolError:
                repo.discard()
                raise

    @server.ani_tool(kind="wait", read_only=True, idempotent=True, title="Wait")
    async def wait(
        seconds: Annotated[float, Field(ge=0, le=MAX_WAIT_S, description=f"Longest wait (0-{MAX_WAIT_S:g} s).")] = 30.0,
    ) -> StatusResult:
        """Wait until the reconciler has dealt with HEAD (applied it, or failed to) or the time is up; returns reconcile_status."""
        deadline = time.monotonic() + seconds
        head = repo.head()
        while True:
            st = await anyio.to_thread.run_sync(_status)
            done = head is not None and (st.applied_commit == head or st.failed_commit == head) and bool(st.recent) and \
                st.recent[0]["commit"] == head and st.recent[0]["result"] != "retry"  # fmt: skip
            if done or time.monotonic() >= deadline or not st.reconciler_running:
                return st
            await anyio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))  # poll interval of the status file

    return server


__all__ = ["A3ROptions", "Problem", "build_server"]
