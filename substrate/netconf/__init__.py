"""The routers' management plane: NETCONF over SSH (RFC 6241, RFC 6242) with YANG models.

One host-side process per lab (:mod:`substrate.netconf.server`) serves every router of the lab,
each on its own SSH endpoint on 127.0.0.1. :func:`ensure_server` starts it on first use (and
again if it died); :func:`stop_server` stops it (lab destroy and lab reset call it: a reset
ends every session, lock and pending confirmed commit); :func:`endpoints` says
how to connect. The models: :mod:`substrate.netconf.schema`; device data and commits:
:mod:`substrate.netconf.device`; datastore operations: :mod:`substrate.netconf.data`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from substrate.errors import SubstrateError

#: Servers this process started (kept so that their Popen objects are not collected while they
#: run: the server outlives the call that started it, and usually this process too).
_SPAWNED: list[subprocess.Popen] = []
#: Bound on the wait for a freshly started server to listen (seconds).
START_TIMEOUT_S = 30.0


class NetconfUnavailable(SubstrateError):
    """The lab's NETCONF server could not be started or reached."""


@dataclass(frozen=True)
class Endpoint:
    """How to reach one router's NETCONF server: ``ssh -p PORT -i KEY USER@HOST -s netconf``."""

    device: str
    host: str
    port: int
    user: str
    key_file: str
    host_key: str


def _info_path(lab: Any) -> Path:
    return Path(lab.dir) / "netconf" / "server.json"


def _read_info(lab: Any) -> dict | None:
    from substrate.lab import pid_alive

    try:
        info = json.loads(_info_path(lab).read_text())
    except (OSError, ValueError):
        return None
    return info if pid_alive(int(info.get("pid", 0))) else None


def server_pid(lab: Any) -> int | None:
    """PID of the lab's running NETCONF server, or None."""
    info = _read_info(lab)
    return int(info["pid"]) if info else None


def ensure_server(lab: Any, *, timeout_s: float = START_TIMEOUT_S) -> dict[str, Endpoint]:
    """Start the lab's NETCONF server unless it runs; return every router's endpoint.

    Raises:
        NetconfUnavailable: it did not come up within ``timeout_s`` (its log is quoted).
    """
    from substrate.netconf.keys import server_dir

    info = _read_info(lab)
    if info is None:
        try:
            d = server_dir(lab)
        except FileNotFoundError:
            raise NetconfUnavailable(f"lab {lab.name} is gone (its directory {lab.dir} no longer exists)") from None
        with open(d / "spawn.lock", "w") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            info = _read_info(lab)
            if info is None:
                with contextlib.suppress(FileNotFoundError):
                    (d / "server.json").unlink()
                logf = open(d / "server.log", "ab")  # noqa: SIM115 - handed to the child
                proc = subprocess.Popen([sys.executable, "-m", "substrate.netconf.server", lab.name],
                                        stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                                        cwd="/")
                logf.close()
                _SPAWNED.append(proc)
                deadline = time.monotonic() + timeout_s
                while info is None:
                    if proc.poll() is not None:
                        raise NetconfUnavailable(f"the NETCONF server of lab {lab.name} exited ({proc.returncode}): "
                                                 f"{_tail(d / 'server.log')}")
                    if time.monotonic() > deadline:
                        with contextlib.suppress(ProcessLookupError):
                            proc.kill()
                        raise NetconfUnavailable(f"the NETCONF server of lab {lab.name} did not listen within "
                                                 f"{timeout_s:g} s: {_tail(d / 'server.log')}")
                    time.sleep(0.05)  # poll interval: exits as soon as the server has written its endpoints
                    info = _read_info(lab)
    return {dev: Endpoint(device=dev, host=info["host"], port=int(port), user=info["user"],
                          key_file=info["client_key"], host_key=info["host_key"])
            for dev, port in info["endpoints"].items()}


def _tail(p: Path) -> str:
    try:
        return p.read_text(errors="replace")[-600:].strip() or "(no output)"
    except OSError:
        return "(no log)"


def stop_server(lab: Any, *, timeout_s: float = 5.0) -> bool:
    """Stop the lab's NETCONF server if it runs (SIGTERM, then SIGKILL). Returns whether one ran."""
    from substrate.lab import pid_alive

    from substrate.process import terminate

    pid = server_pid(lab)
    if pid is None:
        return False
    terminate(pid, timeout_s, alive=pid_alive)
    return True


def endpoints(lab: Any) -> dict[str, Endpoint]:
    """Every router's endpoint (starts the server if needed)."""
    return ensure_server(lab)
