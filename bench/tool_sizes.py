#!/usr/bin/env python3
"""What each ANI level sends an agent, in bytes and estimated tokens: the ``tools/list`` answer
(clients resend it with every model turn) and the results of typical calls, on the reference
brownfield (25 routers, density 2), through a real MCP client (in-process, initialize mode).

Per level: the size of the tools/list JSON-RPC message and of its largest tool; then per typical
call, the size of its JSON-RPC message (text and structured copy, as sent), of the text copy a
client shows the model, the estimated tokens of that text (characters / 4, the usual rule of
thumb for English and JSON; a model's tokenizer differs by tens of percent), and how many texts
were cut for read_output. The figures to watch: a tools/list a client pays every turn, and
results against the ~10,000-token output that some clients warn about (Claude Code's
MAX_MCP_OUTPUT_TOKENS default is 25,000 and it warns above 10,000).

Usage: sudo .venv/bin/python bench/tool_sizes.py [--manifest manifests/srv6-brownfield.yaml] [--lab NAME]
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

import anyio
from mcp import Client
from mcp_types import JSONRPCResponse

from servers.common import ServerConfig
from servers.common.paging import CUT_MARKER, message_bytes
from servers.registry import build_server

#: Typical calls per level: (label, tool, arguments); ``{pe}`` is a PE router of the scenario.
CALLS: dict[str, list[tuple[str, str, dict[str, Any]]]] = {
    "A0": [("list_devices", "list_devices", {}),
           ("running config of a PE (vtysh)", "run_shell", {"device": "{pe}", "command": "vtysh -c 'show running-config'"}),
           ("every route of a PE", "run_shell", {"device": "{pe}", "command": "ip -6 route show table all"})],
    "A1": [("get_topology", "get_topology", {}),
           ("get_running_config, one PE", "get_running_config", {"devices": ["{pe}"]}),
           ("get_running_config, every router", "get_running_config", {"devices": "{routers}"}),
           ("show ip route (one PE)", "execute_validation", {"commands": {"{pe}": "show ipv6 route"}})],
    "A2": [("list_devices", "list_devices", {}),
           ("get_config running, one PE", "get_config", {"device": "{pe}", "source": "running"})],
    "A3-T": [("list_service_classes", "list_service_classes", {}),
             ("list_services tenant_site", "list_services", {"service_class": "tenant_site"}),
             ("list_services attachment_circuit", "list_services", {"service_class": "attachment_circuit"})],
    "A3-R": [("list_records", "list_records", {}),
             ("list_records tenant_site (with its schema)", "list_records", {"service_class": "tenant_site"}),
             ("read_record (a site of the PE)", "read_record", {"service_class": "tenant_site", "id": "{site}"}),
             ("reconcile_status", "reconcile_status", {}),
             ("history", "history", {})],
    "A4": [("list_service_classes", "list_service_classes", {}),
           ("list_services tenant_site", "list_services", {"service_class": "tenant_site"}),
           ("reconcile_status", "reconcile_status", {}),
           ("history", "history", {})],
}


def fill(value: Any, pe: str, routers: list[str], site: str = "") -> Any:
    """``value`` with ``{pe}``, ``{site}`` (a site of that PE) and ``{routers}`` filled in."""
    if value == "{routers}":
        return routers
    if isinstance(value, str):
        return value.replace("{pe}", pe).replace("{site}", site)
    if isinstance(value, dict):
        return {fill(k, pe, routers, site): fill(v, pe, routers, site) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, pe, routers, site) for v in value]
    return value


def wire(result: Any) -> int:
    body = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return len(JSONRPCResponse(jsonrpc="2.0", id=1, result=body).model_dump_json(by_alias=True, exclude_unset=True).encode())


def cuts(value: Any) -> int:
    if isinstance(value, str):
        return 1 if CUT_MARKER.search(value) else 0
    if isinstance(value, dict):
        return sum(cuts(v) for v in value.values())
    if isinstance(value, list):
        return sum(cuts(v) for v in value)
    return 0


async def level_sizes(level: str, lab: Any, pe: str, site: str = "") -> None:
    """Print the tools/list size of ``level`` over ``lab`` and the sizes of its typical calls."""
    server = build_server(level, ServerConfig(lab=lab.name))
    try:
        async with Client(server, mode="legacy") as c:
            listed = await c.list_tools()
            largest = max(listed.tools, key=lambda t: len(t.model_dump_json(by_alias=True, exclude_none=True)))
            size = wire(listed)
            one = len(largest.model_dump_json(by_alias=True, exclude_none=True))
            print(f"{level:<5} tools/list: {len(listed.tools):2d} tools, {size:7,d} B (~{size // 4:6,d} tokens); "
                  f"largest {largest.name} {one:,d} B")
            routers = lab.routers()
            for label, tool, args in CALLS[level]:
                if tool not in {t.name for t in listed.tools}:
                    print(f"      {label:<36} (no tool {tool})")
                    continue
                r = await c.call_tool(tool, fill(args, pe, routers, site))
                text = "\n".join(getattr(x, "text", "") for x in r.content)
                print(f"      {label:<36} {message_bytes(r):7,d} B message, {len(text):7,d} chars text "
                      f"(~{len(text) // 4:6,d} tokens), {cuts(r.structured_content or text)} cut"
                      + (" ERROR " + text[:80] if r.is_error else ""))
    finally:
        server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default="manifests/srv6-brownfield.yaml")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--density", type=int, default=2)
    ap.add_argument("--lab", help="a deployed scenario lab to use instead of deploying one")
    ap.add_argument("--levels", default="A0,A1,A2,A3-T,A3-R,A4")
    args = ap.parse_args()
    from substrate import Lab
    from substrate.scenario import build, load_manifest
    from substrate.scenario.deploy import deploy_scenario

    sc = build(load_manifest(args.manifest), seed=args.seed, density=args.density)
    lab = Lab.attach(args.lab) if args.lab else deploy_scenario(sc, f"bench-sizes-{uuid.uuid4().hex[:6]}")
    try:
        pe = sorted({s.pe for s in sc.all_sites()}, key=lambda n: int(n[1:]))[0]
        site = next(s.id for s in sc.all_sites() if s.pe == pe)
        print(f"scenario {args.manifest} seed {args.seed} density {args.density}: {len(lab.routers())} routers; "
              f"typical PE {pe}; tokens ~ characters / 4")
        for level in args.levels.split(","):
            anyio.run(level_sizes, level, lab, pe, site)
    finally:
        if not args.lab:
            lab.destroy()


if __name__ == "__main__":
    main()
