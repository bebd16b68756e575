"""The YANG schema of an anibench router: which modules, where their text is, and validation of
instance data with libyang.

Modules: FRR's own (``/usr/share/yang``: frr-interface with the frr-zebra and frr-isisd
augments for interfaces, addresses and IS-IS; frr-routing with frr-staticd for static routes)
and the project's ``anibench-kernel`` (package data beside this file) for the kernel state FRR
8.4 does not model: SRv6 seg6local SIDs, encapsulating routes, the other routes of every table,
policy-routing rules, nftables.

libyang is not thread-safe per context: every use goes through :data:`LOCK`.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from substrate.errors import SubstrateError

#: Where Debian's frr package installs FRR's YANG modules.
FRR_YANG_DIR = Path("/usr/share/yang")
#: The project's modules (package data).
OWN_YANG_DIR = Path(__file__).parent / "yang"
#: Modules whose data a router serves (the others are imported for their types).
IMPLEMENTED = ("frr-interface", "frr-zebra", "frr-isisd", "frr-routing", "frr-staticd", "anibench-kernel")
#: libyang's own modules: not part of a router's schema.
_INTERNAL = frozenset({"yang", "ietf-yang-metadata", "ietf-yang-schema-mount", "ietf-yang-structure-ext",
                       "ietf-datastores", "ietf-yang-library"})
#: One lock for every libyang call in the process.
LOCK = threading.RLock()


class SchemaError(SubstrateError):
    """Instance data does not conform to the schema. ``path`` is the data path libyang names
    (an instance-identifier, e.g. ``/anibench-kernel:kernel/table[id='101']``), or None."""

    def __init__(self, message: str, path: str | None = None, tag: str = "invalid-value"):
        self.path, self.tag = path, tag
        super().__init__(message)


@dataclass(frozen=True)
class ModuleInfo:
    """A YANG module of the schema: name, revision, namespace, prefix, where its text is."""

    name: str
    revision: str
    namespace: str
    prefix: str
    path: Path | None
    implemented: bool


_LOC = re.compile(r'(?:Data|Schema) location "([^"]+)"')


def _error(e: Exception) -> SchemaError:
    """A libyang error as a :class:`SchemaError` with its data path."""
    text = str(e).replace("failed to parse data tree: ", "").replace("failed to validate: ", "")
    locs = {m.group(0).split()[0]: m.group(1) for m in _LOC.finditer(text)}
    path = locs.get("Data") or locs.get("Schema")  # the data path; for a missing node, its schema path
    msg = _LOC.sub("", text).rstrip(" :.,") or "invalid data"
    msg = re.sub(r"[:.]\s*, line number \d+", "", msg).rstrip(" :.,")
    tag = "invalid-value"
    low = msg.lower()
    if "mandatory" in low or "missing" in low and "key" in low:
        tag = "data-missing"
    elif "not found as a child" in low or "unknown element" in low:
        tag = "unknown-element"
    elif "duplicate" in low:
        tag = "data-exists"
    return SchemaError(msg, path, tag)


@lru_cache(maxsize=1)
def context():  # noqa: ANN201 - libyang.Context
    """The process's libyang context with every module loaded (cached).

    Raises:
        SchemaError: libyang or a module is missing (install libyang2 and frr).
    """
    try:
        import libyang
        from _libyang import ffi, lib
    except ImportError as e:  # pragma: no cover - install.sh installs it
        raise SchemaError(f"the libyang Python bindings are not installed ({e}); run install.sh") from None
    with LOCK:
        lib.ly_log_options(lib.LY_LOSTORE)
        lib.ly_set_log_clb(ffi.NULL, True)  # keep the data path of each error
        ctx = libyang.Context(f"{OWN_YANG_DIR}:{FRR_YANG_DIR}")
        for name in IMPLEMENTED:
            try:
                ctx.load_module(name)
            except libyang.LibyangError as e:
                raise SchemaError(f"cannot load YANG module {name}: {e}") from None
        return ctx


@lru_cache(maxsize=1)
def _modules() -> tuple[ModuleInfo, ...]:
    """Every module of the schema (implemented and imported), sorted by name; libyang's own
    internal modules (yang, ietf-yang-library, ...) are left out."""
    from libyang.util import c2str

    ctx = context()
    out = []
    with LOCK:
        for m in ctx:
            name = m.name()
            revs = [str(r.date()) for r in m.revisions()]
            rev = revs[0] if revs else ""
            if name in _INTERNAL:
                continue
            path = _module_path(name, rev)
            out.append(ModuleInfo(name=name, revision=rev, namespace=c2str(m.cdata.ns), prefix=m.prefix(), path=path,
                                  implemented=m.implemented() and name in IMPLEMENTED))
    return tuple(sorted(out, key=lambda x: x.name))


def modules() -> list[ModuleInfo]:
    """Every module of the schema (implemented and imported), sorted by name; libyang's own
    internal modules (yang, ietf-yang-library, ...) are left out."""
    return list(_modules())


def _module_path(name: str, revision: str) -> Path | None:
    for d in (OWN_YANG_DIR, FRR_YANG_DIR):
        for cand in (d / f"{name}@{revision}.yang", d / f"{name}.yang"):
            if cand.is_file():
                return cand
    return None


def module_text(identifier: str, version: str | None = None) -> str:
    """The YANG text of module ``identifier`` (RFC 6022 get-schema).

    Raises:
        SchemaError: unknown module or revision (tag ``invalid-value``).
    """
    for m in modules():
        if m.name == identifier and (not version or version == m.revision):
            if m.path is not None:
                return m.path.read_text()
            with LOCK:  # a module libyang carries built in (ietf-inet-types, ietf-yang-types)
                return context().get_module(m.name).print_mem("yang")
    known = ", ".join(m.name for m in modules())
    raise SchemaError(f"no module {identifier!r}{' revision ' + version if version else ''}; modules: {known}")


def namespaces() -> dict[str, str]:
    """Module name -> XML namespace."""
    return {m.name: m.namespace for m in modules()}


def validate_xml(xml: str, *, semantic: bool = True) -> None:
    """Validate configuration instance data (a sequence of top-level elements, XML).

    Args:
        xml: the data (no ``<data>``/``<config>`` wrapper).
        semantic: also check mandatory nodes, leafrefs, must/when and unique (else types and
            structure only).

    Raises:
        SchemaError: naming the data path and what is wrong.
    """
    import libyang

    ctx = context()
    with LOCK:
        try:
            tree = ctx.parse_data_mem(xml or "", "xml", strict=True, no_state=True, parse_only=not semantic,
                                      validate_present=semantic)
        except libyang.LibyangError as e:
            raise _error(e) from None
        if tree is not None:
            tree.free()


def print_defaults(xml: str, mode: str) -> str:
    """Re-print configuration data per RFC 6243 with-defaults ``mode``: ``report-all`` adds the
    schema defaults of absent leaves, ``trim`` removes leaves equal to their default,
    ``explicit`` (the basic mode here) returns the data unchanged.

    Raises:
        SchemaError: the data does not parse.
    """
    if mode == "explicit" or not xml.strip():
        return xml
    import libyang

    ctx = context()
    with LOCK:
        try:
            tree = ctx.parse_data_mem(xml, "xml", strict=True, no_state=False, parse_only=True)
        except libyang.LibyangError as e:
            raise _error(e) from None
        if tree is None:
            return xml
        try:
            if mode == "report-all":
                tree.validate(no_state=False)
                return tree.print_mem("xml", with_siblings=True, pretty=False, include_implicit_defaults=True)
            return tree.print_mem("xml", with_siblings=True, pretty=False, trim_default_values=True)
        except libyang.LibyangError as e:
            raise _error(e) from None
        finally:
            tree.free()
