"""Record the kernel side of the conformance suite from the qemu guest into the repository.

``sudo .venv/bin/python conformance/record.py [--lab] [--no-corpus]``

Boots the guest (:mod:`conformance.guest`: Debian's stock cloud kernel, seg6 built in, under
TCG), runs ``conformance/runner.py --plane kernel`` in it natively (the host's own ``ip`` and
Python through the shared root) and writes ``conformance/recorded/kernel.json``: what every
command and probe gave on the kernel's seg6, which ``tests/test_conformance.py`` compares the
eBPF data plane against on every CI run (CI has no seg6, and booting the guest under TCG takes
longer than CI can give it). Re-run it whenever ``corpus/`` or ``probes.py`` change (the test
says so when they have).

``--lab`` also brings a 3-router lab up on the ``kernel`` data plane in the guest (``harness lab
up --dataplane kernel --topology line:3``), pings h1 -> h3 over SRv6 both ways (H.Encaps at the
PEs, uN at r2, uDT6 at the far PE) and takes it down, and records how that went and how long it
took in ``conformance/recorded/kernel-lab.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from conformance import guest  # noqa: E402

RECORDED = HERE / "recorded"
KERNEL_RESULTS = RECORDED / "kernel.json"
LAB_RESULTS = RECORDED / "kernel-lab.json"
#: The files whose content the recorded results depend on.
INPUTS = ("corpus/commands.txt", "corpus/probes.txt", "probes.py", "runner.py")
LAB = "cfkernel"

LAB_SCRIPT = f"""
cd {REPO}
H={REPO}/.venv/bin/harness
step() {{ s=$(cut -d' ' -f1 /proc/uptime); echo "== $* (uptime $s)"; }}
step up
$H lab up --name {LAB} --dataplane kernel --topology line:3 --timeout 600 || echo "lab-up-failed"
step srv6-routes
$H lab exec {LAB} r3 -- ip -6 route add fcbb:bb00:3:e006::/64 encap seg6local action End.DT6 table 254 count dev sr0
$H lab exec {LAB} r1 -- ip -6 route add fcbb:bb00:1:e006::/64 encap seg6local action End.DT6 table 254 count dev sr0
$H lab exec {LAB} r1 -- ip -6 route add fd00:1:3::/64 encap seg6 mode encap segs fcbb:bb00:2:3:e006:: dev sr0
$H lab exec {LAB} r3 -- ip -6 route add fd00:1:1::/64 encap seg6 mode encap segs fcbb:bb00:2:1:e006:: dev sr0
step ping
$H lab exec {LAB} h1 -- ping -6 -c 3 -i 0.5 -W 10 fd00:1:3::2; echo "ping-status $?"
$H lab exec {LAB} r1 -- ip -6 -s route show fcbb:bb00:1:e006::/64
$H lab exec {LAB} r3 -- ip -6 -s route show fcbb:bb00:3:e006::/64
$H lab exec {LAB} r2 -- ip -6 -s route show fcbb:bb00:2::/48
{REPO}/.venv/bin/python -m substrate.dataplane
step down
$H lab down {LAB}; echo "down-status $?"
step done
"""


def inputs_digest() -> str:
    """sha256 of the files the kernel results depend on (:data:`INPUTS`)."""
    h = hashlib.sha256()
    for name in INPUTS:
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes())
    return h.hexdigest()


def corpus_script() -> str:
    """The guest's script for the corpus: the runner on the kernel plane, results into ``$OUT``."""
    return (f"cd {REPO}\nt0=$(cut -d' ' -f1 /proc/uptime)\n"
            f"ANIBENCH_PROBE_WAIT_S=20 ANIBENCH_COMMAND_TIMEOUT_S=900 python3 {REPO}/conformance/runner.py --plane kernel --probes-first --out $OUT/kernel.json\n"
            "st=$?\necho \"corpus $t0 $(cut -d' ' -f1 /proc/uptime)\" > $OUT/corpus-uptime\nexit $st\n")  # fmt: skip


def run_kernel_side(out: Path, *, timeout_s: float = 5400.0) -> tuple[dict, dict]:
    """Run the corpus in the guest; returns (results document, timing) where timing has
    ``guest_s`` (qemu start to exit), ``boot_s`` (guest uptime when the script started) and
    ``corpus_s`` (the runner's own wall time in the guest).

    Raises:
        RuntimeError: the guest did not produce results (its log's tail in the message).
    """
    run = guest.run(corpus_script(), out=out, timeout_s=timeout_s)
    res = out / "kernel.json"
    if run.status != 0 or not res.exists():
        raise RuntimeError(f"the kernel guest failed (status {run.status}):\n{run.log[-2000:]}\n{run.console[-2000:]}")
    doc = json.loads(res.read_text())
    corpus_s = None
    try:
        a, b = (out / "corpus-uptime").read_text().split()[1:3]
        corpus_s = round(float(b) - float(a), 2)
    except (OSError, ValueError):
        pass
    return doc, {"guest_s": run.seconds, "boot_s": run.boot_seconds, "corpus_s": corpus_s}


def strip_volatile(doc: dict) -> dict:
    """The results without per-command and per-probe wall times (which change on every run)."""
    for c in doc.get("cases", []):
        for r in c["commands"]:
            r.pop("seconds", None)
    for p in (doc.get("probes") or {}).get("probes", []):
        p.pop("seconds", None)
    return doc


def run_lab(out: Path, *, timeout_s: float = 5400.0) -> dict:
    """Bring the 3-router lab up, ping over SRv6 and down, on the kernel data plane in the guest;
    returns what happened (log, step uptimes, wall time)."""
    t = time.monotonic()
    run = guest.run(LAB_SCRIPT, out=out, timeout_s=timeout_s)
    steps = {}
    for line in run.log.splitlines():
        if line.startswith("== ") and "(uptime " in line:
            name = line[3:].split(" (uptime ")[0]
            steps[name] = float(line.rsplit(" ", 1)[1].rstrip(")"))
    ok = "ping-status 0" in run.log and "down-status 0" in run.log and "lab-up-failed" not in run.log
    return {"ok": ok, "status": run.status, "guest_s": run.seconds, "boot_s": run.boot_seconds,
            "wall_s": round(time.monotonic() - t, 2), "steps_uptime": steps, "log": run.log}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab", action="store_true", help="also run the 3-router lab on the kernel data plane")
    ap.add_argument("--no-corpus", action="store_true", help="do not (re-)record the corpus")
    a = ap.parse_args(argv)
    RECORDED.mkdir(exist_ok=True)
    if not a.no_corpus:
        with tempfile.TemporaryDirectory(prefix="anibench-record-") as tmp:
            doc, timing = run_kernel_side(Path(tmp))
        doc = strip_volatile(doc)
        doc["recorded"] = {"inputs_sha256": inputs_digest(), "guest": f"{guest.KERNEL_PACKAGE} under qemu TCG",
                           "timing": timing}  # fmt: skip
        KERNEL_RESULTS.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"recorded {KERNEL_RESULTS} ({doc['environment']['kernel']}): guest {timing['guest_s']} s, "
              f"boot {timing['boot_s']} s, corpus {timing['corpus_s']} s")  # fmt: skip
    if a.lab:
        with tempfile.TemporaryDirectory(prefix="anibench-record-lab-") as tmp:
            lab = run_lab(Path(tmp))
        LAB_RESULTS.write_text(json.dumps(lab, indent=1, sort_keys=True) + "\n")
        print(f"kernel-data-plane lab in the guest: {'ok' if lab['ok'] else 'FAILED'}, guest {lab['guest_s']} s "
              f"(boot {lab['boot_s']} s), steps {lab['steps_uptime']}")  # fmt: skip
        if not lab["ok"]:
            print(lab["log"][-3000:])
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
