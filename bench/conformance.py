#!/usr/bin/env python3
"""The live differential conformance run (issue 34): the corpus and the packet probes on the
kernel's own seg6 (a qemu guest, TCG) and on the eBPF data plane (this host), compared.

Prints the figures: commands and probes compared, identical, documented and unexplained
differences (each unexplained one in full), and the times -- the guest's boot, the corpus in the
guest, the whole guest run, the eBPF side, the wall time of the whole comparison. CI compares the
eBPF side against outputs recorded from the same guest (``conformance/record.py``,
``tests/test_conformance.py``); this script re-runs the kernel side live.

Usage: sudo .venv/bin/python bench/conformance.py [--lab] [--save-kernel FILE] [--kernel FILE]
  --lab          also time the 3-router lab on the kernel data plane in the guest
  --save-kernel  keep the guest's results document in FILE
  --kernel FILE  compare against FILE instead of booting the guest (the eBPF side only, live)
Exit status 1 when a difference is unexplained.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance import compare, record, runner  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab", action="store_true")
    ap.add_argument("--save-kernel", default="")
    ap.add_argument("--kernel", default="")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    timing: dict = {}
    if a.kernel:
        kernel = json.loads(Path(a.kernel).read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="anibench-bench-conformance-") as tmp:
            kernel, timing = record.run_kernel_side(Path(tmp))
        if a.save_kernel:
            Path(a.save_kernel).write_text(json.dumps(kernel, indent=1) + "\n")
    t1 = time.monotonic()
    ebpf = runner.run_all("ebpf")
    ebpf_s = time.monotonic() - t1
    rep = compare.compare(kernel, ebpf)
    print(compare.format_report(rep), end="")
    print()
    if timing:
        print(f"guest (qemu TCG, {kernel['environment']['kernel']}): boot {timing['boot_s']} s, corpus in the guest "
              f"{timing['corpus_s']} s, whole guest run {timing['guest_s']} s")  # fmt: skip
    print(f"eBPF side on this host: {ebpf_s:.1f} s (commands {ebpf['timing']['commands_s']} s, probes "
          f"{ebpf['timing'].get('probes_s')} s)")  # fmt: skip
    print(f"whole comparison: {time.monotonic() - t0:.1f} s wall")
    if a.lab:
        with tempfile.TemporaryDirectory(prefix="anibench-bench-lab-") as tmp:
            lab = record.run_lab(Path(tmp))
        print(f"3-router lab on the kernel data plane in the guest: {'ok' if lab['ok'] else 'FAILED'}; guest run "
              f"{lab['guest_s']} s (boot {lab['boot_s']} s); step uptimes {lab['steps_uptime']}")  # fmt: skip
        if not lab["ok"]:
            print(lab["log"][-3000:])
    return 1 if rep.unexplained() or rep.problems else 0


if __name__ == "__main__":
    sys.exit(main())
