"""A3-R's source of truth: one Git repository per lab holding the desired state as service records
(draft-salsano-nmrg-nmaa-benchmarking-framework section 5.1, Table 1: "A3-R: reconciled source of
truth -- versioned desired state, drift detection and reconciliation").

Layout: ``<lab dir>/a3r/repo`` is an ordinary Git repository (the ``git`` command; ``git log``
there is the history a user inspects). Each record is one YAML file
``records/<service_class>/<id>.yaml`` holding the instance's spec -- the create spec of the A3-T
catalog (:mod:`servers.a3_intent.catalog`), validated by the same pydantic models, so a record
that does not validate is refused with its field path and never committed. Resources the server
allocates (SIDs, tables, marks) are not records: the reconcile allocates them, as A3-T does.

The first commit is the lab's baseline, generated from the deployed scenario's inventory. The
repository belongs to one baseline epoch of the lab (:func:`substrate.scenario.deploy.baseline_epoch`):
after a lab reset it is made again from the baseline.

The working tree is the agent's working change (written by the A3-R server); the reconciler reads
only commits (``HEAD``), never the working tree.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import TypeAdapter, ValidationError

from servers.a3_intent import catalog as cat
from servers.a3_intent.catalog import Problem, natural_key
from substrate.scenario.layers import intents

if TYPE_CHECKING:
    from substrate.lab import Lab
    from substrate.scenario.model import Scenario

#: Directory of A3-R's state in a lab directory, and the repository in it.
STATE_DIR = "a3r"
REPO_DIR = "repo"
RECORDS = "records"
EPOCH_FILE = "anibench-epoch"
#: Author and committer of the baseline commit and of the reconciler's own commits.
SYSTEM_AUTHOR = ("anibench", "anibench@lab.invalid")
#: Bound on one git command (seconds).
GIT_TIMEOUT_S = 30.0
#: What the last remaking of the repository (a new baseline epoch: a lab reset) discarded, in the state directory.
DISCARDED_FILE = "discarded.json"
#: Most discarded commits named there.
MAX_NOTED = 20
#: Bound on a commit's wait for a lab reset in progress (seconds; a reset of the 62-node lab takes
#: well under this on a loaded 2-core machine).
RESET_WAIT_S = 120.0
#: Largest record file accepted (bytes).
MAX_RECORD_BYTES = 64_000

#: Desired state: service class -> instance id -> spec (JSON form).
Desired = dict[str, dict[str, dict[str, Any]]]


class SourceError(Exception):
    """A git operation failed or the repository cannot be used; says which and why."""


class RecordRejected(Exception):
    """A record does not validate; ``problems`` name each field path (``records/tenant_site/t3s4.yaml: spec.prefix6: ...``)."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("record rejected; nothing was written:\n" + "\n".join(f"- {p}" for p in problems))


class CommitInvalid(SourceError):
    """A commit's records do not validate (made by hand outside A3-R): never applied; names the
    commit, the file and the field path."""


class _RecordLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases: a record is a plain mapping, and an alias is how a
    small file expands into a huge document (the "billion laughs")."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            ev = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"YAML alias *{ev.anchor} is not accepted in a record", ev.start_mark)
        return super().compose_node(parent, index)


def load_record(text: str | bytes, *, where: str = "spec") -> Any:
    """The YAML document of a record file (no aliases, at most MAX_RECORD_BYTES, UTF-8).

    Raises:
        RecordRejected: it cannot be read (path ``where``), with the reason.
    """
    if len(text) > MAX_RECORD_BYTES:
        raise RecordRejected([Problem(path=where, message=f"the file is {len(text)} bytes, more than {MAX_RECORD_BYTES}")])
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError as e:
            raise RecordRejected([Problem(path=where, message=f"not UTF-8 text: {e.reason} at byte {e.start}")]) from None
    try:
        return yaml.load(text, Loader=_RecordLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise RecordRejected([Problem(path=where, message=f"not a valid YAML record: {' '.join(str(e).split())[:300]}")]) from None


#: C0 and C1 control characters and DEL: no record field holds one (ids, names, prefixes, ports).
_CONTROL = {c for c in range(0x20)} | {0x7F} | set(range(0x80, 0xA0))


def _control_chars(value: Any, where: str) -> list[Problem]:
    """A Problem per string (key or value) in ``value`` holding a control character."""
    if isinstance(value, str):
        bad = next((c for c in value if ord(c) in _CONTROL), None)
        return [] if bad is None else [Problem(path=where, message=f"holds the control character U+{ord(bad):04X}; not accepted")]
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            out += _control_chars(k, where) if isinstance(k, str) else []
            out += _control_chars(v, f"{where}.{k}")
        return out
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _control_chars(v, f"{where}.{i}")]
    return []


def check_message(message: str, *, where: str = "message") -> str:
    """A commit message as given, if it holds no control character but newline and tab (C0, DEL,
    C1: git would store a NUL-free escape sequence as is, and ``git log`` in a terminal would
    run it; git refuses a NUL outright).

    Raises:
        RecordRejected: it holds one (path ``where``, the character and its position).
    """
    for i, c in enumerate(message):
        if ord(c) in _CONTROL and c not in "\n\t":
            raise RecordRejected([Problem(path=where, message=f"holds the control character U+{ord(c):04X} at position {i}; "
                                                              "not accepted (newline and tab are)")])  # fmt: skip
    return message


def record_path(service_class: str, iid: str) -> str:
    """Path of a record in the repository."""
    return f"{RECORDS}/{service_class}/{iid}.yaml"


def writable_classes(sc: Scenario) -> list[str]:
    """The catalog classes the scenario offers that records describe (read-only ones excluded)."""
    return [n for n in cat.classes_of(sc.layers) if n in cat.SERVICE_CLASSES]


def normalize(service_class: str, spec: Any, *, where: str = "spec") -> dict[str, Any]:
    """A record's spec validated by the class's A3-T spec model, in JSON form.

    Raises:
        RecordRejected: every violation, with its field path under ``where``.
    """
    model = cat.SPEC_MODELS[service_class]
    if bad := _control_chars(spec, where):
        raise RecordRejected(bad)
    try:
        return model.model_validate(spec).model_dump(mode="json")
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = ".".join([where, *(str(x) for x in err.get("loc", ()))])
            msg = err.get("msg", "invalid").removeprefix("Value error, ")
            problems.append(Problem(path=loc, message="field required" if err.get("type") == "missing" else
                                    "unexpected field" if err.get("type") == "extra_forbidden" else msg))  # fmt: skip
        raise RecordRejected(problems) from None


def check_id(service_class: str, iid: str) -> str:
    """``iid`` if it is a valid id of ``service_class`` (the catalog's id form).

    Raises:
        RecordRejected: it is not (path ``id``).
    """
    try:
        return str(TypeAdapter(cat.INTENTS[service_class].id_type).validate_python(iid))
    except ValidationError as e:
        raise RecordRejected([Problem(path="id", message=f"{iid[:64]!r} is not a valid {service_class} id: {e.errors()[0]['msg']}")]) from None


def desired_of(sc: Scenario) -> Desired:
    """The records of an inventory (every writable instance's spec, normalized)."""
    out: Desired = {}
    for name in writable_classes(sc):
        it = cat.INTENTS[name]
        out[name] = {x.id: normalize(name, it.spec_of(x)) for x in it.instances(sc)}
    return out


def _same(desired: dict[str, Any], applied: dict[str, Any]) -> bool:
    """A desired spec equals an applied one; a desired ``auto`` equals whatever was allocated."""
    return all(v == cat.AUTO or applied.get(k) == v for k, v in desired.items()) and set(applied) <= set(desired) | {
        k for k, v in applied.items() if v is None}


def ops_toward(desired: Desired, applied: Desired) -> tuple[list[dict[str, Any]], list[str]]:
    """The A3-T change set turning the ``applied`` records into ``desired`` (create for a new id,
    modify stating the desired record's fields (and null for a field it dropped) where it differs,
    delete for a gone one): deletes first, in reverse registry
    order (dependents before what they depend on), then creates and modifies in registry order.

    Returns:
        ``(ops, where)``: the operations and, per operation, the record file it comes from.
    """
    order = [i.name for i in intents() if not i.read_only and (i.name in desired or i.name in applied)]
    ops: list[dict[str, Any]] = []
    where: list[str] = []
    for name in reversed(order):
        for iid in sorted(set(applied.get(name, {})) - set(desired.get(name, {})), key=natural_key):
            ops.append({"op": "delete", "service_class": name, "id": iid})
            where.append(record_path(name, iid))
    for name in order:
        have = applied.get(name, {})
        for iid, spec in sorted(desired.get(name, {}).items(), key=lambda kv: natural_key(kv[0])):
            if iid not in have:
                ops.append({"op": "create", "service_class": name, "id": iid, "spec": spec})
            elif not _same(spec, have[iid]):
                # the whole record, not only the fields that differ: fields that go together (a move's
                # pe and pe_interface, where the port name stays the same) are stated together
                patch = {k: v for k, v in spec.items() if v != cat.AUTO and (v is not None or have[iid].get(k) is not None)}
                patch |= {k: None for k in have[iid] if k not in spec and have[iid][k] is not None}
                ops.append({"op": "modify", "service_class": name, "id": iid, "spec": patch})
            else:
                continue
            where.append(record_path(name, iid))
    return ops, where


def blame(problems: list[Problem], where: list[str]) -> list[Problem]:
    """Planner problems (``ops[2].spec.pe``) re-addressed to record files (``records/tenant_site/t3s4.yaml: spec.pe``)."""
    out = []
    for p in problems:
        path = p.path
        if path.startswith("ops[") and "]" in path:
            i = int(path[4:path.index("]")]) if path[4:path.index("]")].isdigit() else -1
            rest = path[path.index("]") + 1:].lstrip(".")
            if 0 <= i < len(where):
                path = f"{where[i]}: {rest or '(record)'}"
        out.append(Problem(path=path, message=p.message))
    return out


class FileLock:
    """An exclusive lock across processes (``flock`` on ``path``) and threads, re-entrant in the
    thread holding it (a process's second ``flock`` on a new descriptor would wait for itself)."""

    def __init__(self, path: Path):
        self.path = path
        self._held = threading.local()
        self._thread_lock = threading.Lock()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock for the ``with`` block (waits for other holders, unbounded)."""
        if getattr(self._held, "depth", 0):
            self._held.depth += 1
            try:
                yield
            finally:
                self._held.depth -= 1
            return
        with self._thread_lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "w") as lk:
                fcntl.flock(lk, fcntl.LOCK_EX)
                self._held.depth = 1
                try:
                    yield
                finally:
                    self._held.depth = 0


class ResetInProgress(SourceError):
    """A lab reset held the lab's baseline lock for the whole bounded wait of a commit."""


class Repo:
    """The lab's source-of-truth repository (see module docstring). Thread- and process-safe for
    writers through :meth:`locked`."""

    def __init__(self, lab: Lab):
        self.lab = lab
        self.state_dir = Path(lab.dir) / STATE_DIR
        self.dir = self.state_dir / REPO_DIR
        self._lock = FileLock(self.state_dir / "repo.lock")

    # -- git --------------------------------------------------------------------------------------

    def git(self, *args: str, input_text: str | None = None, author: tuple[str, str] | None = None, check: bool = True) -> str:
        """Run ``git args`` in the repository (no user or system configuration, no hooks).

        Raises:
            SourceError: git failed (its message quoted) or did not finish within GIT_TIMEOUT_S.
        """
        name, email = author or SYSTEM_AUTHOR
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.state_dir), "GIT_CONFIG_NOSYSTEM": "1",
               "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email,
               "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email, "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"}  # fmt: skip
        try:
            r = subprocess.run(["git", "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false", "-c", "core.quotepath=off",
                                *args], cwd=self.dir, input=input_text, capture_output=True, text=True, env=env,
                               timeout=GIT_TIMEOUT_S, check=False)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SourceError(f"git {args[0]} failed: {e}") from None
        if check and r.returncode != 0:
            raise SourceError(f"git {args[0]} failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-400:]}")
        return r.stdout

    @contextlib.contextmanager
    def committing(self, timeout_s: float = RESET_WAIT_S) -> Iterator[None]:
        """Hold what making a commit needs: the lab's baseline lock, shared
        (:func:`substrate.locks.baseline_lock`: a lab reset waits for the commit to end, and a
        commit waits for a reset in progress, then finds the repository of the new epoch), then
        :meth:`locked`.

        Raises:
            ResetInProgress: a reset held the lab for ``timeout_s`` seconds.
        """
        from substrate.locks import ConfigLockHeld, baseline_lock

        stack = contextlib.ExitStack()
        try:
            stack.enter_context(baseline_lock(Path(self.lab.dir), shared=True, holder="an A3-R commit", timeout_s=timeout_s))
        except ConfigLockHeld as e:
            raise ResetInProgress(f"a lab reset is in progress and did not end within {timeout_s:g} s ({e})") from None
        with stack, self.locked():
            yield

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Serialize writers of the repository across processes and threads (:class:`FileLock`)."""
        return self._lock.held()

    # -- set-up -----------------------------------------------------------------------------------

    def epoch(self) -> str | None:
        try:
            return (self.dir / ".git" / EPOCH_FILE).read_text().strip()
        except OSError:
            return None

    def ensure(self, inventory: Scenario, epoch: str) -> bool:
        """Make the repository with its baseline commit unless it exists for ``epoch`` (after a lab
        reset it is made again). Returns whether it was (re)made. Call under :meth:`locked`.

        Raises:
            SourceError: git failed.
        """
        if self.epoch() == epoch and (self.dir / ".git" / "HEAD").exists():
            return False
        self._note_discarded()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.git("init", "-q", "-b", "main")
        self.set_records(desired_of(inventory))
        (self.dir / "README.md").write_text(
            "# Desired state of this lab (anibench A3-R)\n\nOne YAML file per service record: "
            "records/<service_class>/<id>.yaml holds the instance's spec (the A3-T catalog's create spec).\n"
            "The reconciler drives the network to the last commit (HEAD).\n")  # fmt: skip
        self.git("add", "-A")
        self.git("commit", "-q", "-m", "baseline: the brownfield's service records, generated from the scenario")
        (self.dir / ".git" / EPOCH_FILE).write_text(epoch + "\n")
        return True

    def _note_discarded(self) -> None:
        """Before the repository of an earlier epoch goes: write what goes with it (the commits
        after its baseline commit, whether it had a working change) to :data:`DISCARDED_FILE`,
        which :meth:`discarded` reads (reconcile_status says it: a reset is not silent)."""
        old = self.epoch()
        if old is None or not (self.dir / ".git" / "HEAD").exists():
            return
        try:
            log = self.git("log", "--format=%H %s", "HEAD", check=False).splitlines()
            dirty = bool(self.git("status", "--porcelain", check=False).strip())
        except SourceError:
            log, dirty = [], False
        commits = [{"commit": ln[:40], "subject": ln[41:][:200]} for ln in log[:-1]]  # the last is the baseline commit
        note = {"at": time.time(), "epoch": old, "commits": commits[:MAX_NOTED], "count": len(commits), "working_change": dirty}
        (self.state_dir / DISCARDED_FILE).write_text(json.dumps(note) + "\n")

    def discarded(self, epoch: str) -> dict[str, Any] | None:
        """What the last remaking of the repository discarded, when it was made for ``epoch`` (the
        current one) and discarded anything: ``{"at": unix time, "count": N, "commits": [{"commit",
        "subject"}] (at most :data:`MAX_NOTED`), "working_change": bool}``; else None."""
        try:
            note = json.loads((self.state_dir / DISCARDED_FILE).read_text())
        except (OSError, ValueError):
            return None
        if self.epoch() != epoch or not (note.get("count") or note.get("working_change")):
            return None
        return note

    # -- reading ------------------------------------------------------------------------------------

    def head(self) -> str | None:
        """The commit id of HEAD (None before the baseline)."""
        try:
            return self.git("rev-parse", "--verify", "-q", "HEAD").strip() or None
        except SourceError:
            return None

    def head_fast(self) -> str | None:
        """HEAD's commit id read from the ref file (cheap: the reconciler polls it), else via git."""
        try:
            ref = (self.dir / ".git" / "HEAD").read_text().strip()
            if ref.startswith("ref: "):
                return (self.dir / ".git" / ref[5:]).read_text().strip()
            return ref
        except OSError:
            return self.head()

    def resolve(self, rev: str) -> str:
        """Full commit id of ``rev`` (a commit id or prefix, ``HEAD~1``, ...).

        Raises:
            SourceError: no such commit.
        """
        if rev.startswith("-") or len(rev) > 80:
            raise SourceError(f"not a commit: {rev[:80]!r}")
        out = self.git("rev-parse", "--verify", "-q", f"{rev}^{{commit}}", check=False).strip()
        if not out:
            raise SourceError(f"no commit {rev[:80]!r} in the history (see history)")
        return out

    def desired_at(self, rev: str = "HEAD") -> Desired:
        """The records of a commit (read from git objects, not the working tree), each validated
        as when it is written: a commit made by hand outside A3-R is read like any input.

        Raises:
            SourceError: git failed. CommitInvalid: a file of the commit is not a record of a
                known class and valid id, or does not parse or validate (every problem named).
        """
        listing = self.git("ls-tree", "-r", "-z", rev, "--", RECORDS)
        entries = []
        for item in listing.split("\0"):
            if not item:
                continue
            meta, _, path = item.partition("\t")
            if path.endswith(".yaml"):
                entries.append((meta.split()[2], path))
        texts = self._blobs([sha for sha, _ in entries])
        out: Desired = {}
        problems: list[Problem] = []
        for (_sha, path), text in zip(entries, texts, strict=True):
            parts = path.split("/")
            try:
                if len(parts) != 3:
                    raise RecordRejected([Problem(path="path", message="not records/<service_class>/<id>.yaml")])
                cls, iid = parts[1], parts[2].removesuffix(".yaml")
                if cls not in cat.SPEC_MODELS:
                    raise RecordRejected([Problem(path="service_class", message=f"unknown class {cls[:64]!r}")])
                check_id(cls, iid)
                out.setdefault(cls, {})[iid] = normalize(cls, load_record(text) or {})
            except RecordRejected as e:
                problems += [Problem(path=f"{path[:120]!r}: {p.path}" if any(ord(c) < 32 for c in path) else f"{path[:120]}: {p.path}",
                                     message=p.message) for p in e.problems]  # fmt: skip
        if problems:
            commit = self.git("rev-parse", "--short=12", rev, check=False).strip() or rev[:40]
            raise CommitInvalid(f"commit {commit} holds records that do not validate (never applied): "
                                + "; ".join(f"{p.path}: {p.message}" for p in problems[:8])
                                + (f"; ... {len(problems) - 8} more" if len(problems) > 8 else ""))  # fmt: skip
        return out

    def _blobs(self, shas: list[str]) -> list[bytes]:
        if not shas:
            return []
        out = subprocess.run(["git", "cat-file", "--batch"], cwd=self.dir, input=("\n".join(shas) + "\n").encode(), capture_output=True,
                             timeout=GIT_TIMEOUT_S, check=False).stdout  # fmt: skip
        texts, pos = [], 0
        for _ in shas:
            nl = out.index(b"\n", pos)
            size = int(out[pos:nl].split()[2])
            texts.append(out[nl + 1:nl + 1 + size])
            pos = nl + 1 + size + 1
        return texts

    def working(self) -> tuple[Desired, list[Problem]]:
        """The records of the working tree, each validated; files that do not parse or validate
        are left out and reported."""
        out: Desired = {}
        problems: list[Problem] = []
        base = self.dir / RECORDS
        for path in sorted(base.glob("*/*.yaml")):
            rel = str(path.relative_to(self.dir))
            cls, iid = path.parent.name, path.stem
            try:
                if cls not in cat.SPEC_MODELS:
                    raise RecordRejected([Problem(path="service_class", message=f"unknown class {cls!r}")])
                check_id(cls, iid)
                data = load_record(path.read_bytes())
                out.setdefault(cls, {})[iid] = normalize(cls, data)
            except RecordRejected as e:
                problems += [Problem(path=f"{rel}: {p.path}", message=p.message) for p in e.problems]
            except OSError as e:
                problems.append(Problem(path=rel, message=f"cannot be read: {e}"))
        return out, problems

    def read(self, service_class: str, iid: str) -> str | None:
        """The working tree's text of a record, or None."""
        try:
            return (self.dir / record_path(service_class, iid)).read_text()
        except OSError:
            return None

    # -- writing (the working change) ---------------------------------------------------------------

    def _write(self, rel: str, spec: dict[str, Any]) -> None:
        path = self.dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(spec, sort_keys=False, default_flow_style=False))

    def set_records(self, desired: Desired) -> None:
        """Make the working tree's records exactly ``desired`` (validated specs): files of records
        not in it are removed, every class keeps its directory."""
        for path in (self.dir / RECORDS).glob("*/*.yaml"):
            if path.stem not in desired.get(path.parent.name, {}):
                path.unlink()
        for name, recs in desired.items():
            (self.dir / RECORDS / name).mkdir(parents=True, exist_ok=True)
            (self.dir / RECORDS / name / ".keep").write_text("")
            for iid, spec in recs.items():
                self._write(record_path(name, iid), spec)

    def write(self, service_class: str, iid: str, spec: dict[str, Any]) -> str:
        """Write a validated record into the working tree; returns its path."""
        rel = record_path(service_class, iid)
        self._write(rel, spec)
        return rel

    def delete(self, service_class: str, iid: str) -> bool:
        """Remove a record from the working tree; whether it existed."""
        path = self.dir / record_path(service_class, iid)
        existed = path.exists()
        path.unlink(missing_ok=True)
        return existed

    def status(self) -> list[str]:
        """Changed paths of the working tree against HEAD (``M path``, ``A path``, ``D path``)."""
        self.git("add", "-A", RECORDS)
        out = self.git("diff", "--cached", "--name-status", "--no-renames", "HEAD")
        return [" ".join(ln.split("\t")) for ln in out.splitlines() if ln.strip()]

    def diff(self) -> str:
        """Unified diff of the working tree against HEAD."""
        self.git("add", "-A", RECORDS)
        return self.git("diff", "--cached", "--no-renames", "HEAD")

    def discard(self) -> None:
        """Put the working tree back to HEAD."""
        self.git("reset", "-q", "--hard", "HEAD")
        self.git("clean", "-q", "-fd", "--", RECORDS)

    def set_aside(self) -> list[str]:
        """Put the working change (another client's uncommitted edits) aside, leaving the working
        tree at HEAD; returns its changed paths (empty: nothing to put aside). :meth:`put_back`
        brings it back over a later HEAD. ``git stash`` with untracked files."""
        changed = self.status()
        if changed:
            self.git("stash", "push", "-q", "--include-untracked", "-m", "working change set aside by A4", "--", RECORDS)
        return changed

    def put_back(self) -> str | None:
        """Bring the working change :meth:`set_aside` kept back over the working tree (``git
        stash pop``). Returns None when it came back whole, else why not: it then stays in
        ``git stash`` (its edits conflict with the commits made meanwhile) and the working tree
        is left at HEAD."""
        r = self.git("stash", "pop", "-q", check=False)
        if self.git("stash", "list", check=False).strip():
            self.discard()
            return f"it conflicts with the commits made meanwhile and stays in git stash ({r.strip()[:200] or 'stash@{0}'})"
        return None

    def commit(self, message: str, author: tuple[str, str]) -> str:
        """Commit the working tree; returns the new commit id.

        Raises:
            SourceError: nothing to commit, or git failed.
        """
        if not self.status():
            raise SourceError("nothing to commit: the working change equals HEAD")
        self.git("commit", "-q", "-m", message, author=author)
        return self.head() or ""

    def checkout_tree(self, rev: str) -> None:
        """Make the working tree's records those of commit ``rev`` (for a revert)."""
        shutil.rmtree(self.dir / RECORDS, ignore_errors=True)
        self.git("checkout", rev, "--", RECORDS)

    def log(self, limit: int = 20, skip: int = 0) -> list[dict[str, Any]]:
        """The history, newest first: commit, author, time (ISO 8601), message, files changed."""
        sep = "\x1e"
        out = self.git("log", f"--max-count={limit}", f"--skip={skip}", f"--format={sep}%H%x1f%an <%ae>%x1f%aI%x1f%s",
                       "--name-status", "--no-renames", "HEAD")  # fmt: skip
        items = []
        for chunk in out.split(sep):
            if not chunk.strip():
                continue
            head, _, files = chunk.partition("\n")
            commit, author, when, subject = (head.split("\x1f") + ["", "", "", ""])[:4]
            changed = [" ".join(x.split("\t")) for x in files.splitlines() if x.strip()]
            items.append({"commit": commit, "author": author, "time": when, "message": subject,
                          "files": changed[:30] + ([f"... {len(changed) - 30} more"] if len(changed) > 30 else [])})  # fmt: skip
        return items

    def count(self) -> int:
        return int(self.git("rev-list", "--count", "HEAD").strip() or 0)
