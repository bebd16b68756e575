"""Datastore contents as flat path -> value maps, and the NETCONF operations on them: edit-config
(RFC 6241 section 7.2), subtree and XPath filtering (section 6, section 8.9), with-defaults.

A datastore's content is a :data:`Flat` map, in document order, from libyang's canonical data
paths to values:

- a leaf: ``/m:a/b[k='1']/c`` -> its canonical value (``""`` for an ``empty`` leaf);
- a leaf-list entry: ``/m:a/ll[.='v']`` -> ``v``;
- a list entry and a presence container: its own path -> ``""`` (the entry exists; its keys are
  in the path).

Key leaves and non-presence containers are implied by the paths. XML is produced and parsed by
libyang (so every value is typed and canonical: ``fcbb:bb00:0002::`` and ``fcbb:bb00:2::`` are
the same address), and XML from a peer is parsed by :func:`parse_xml` with entity resolution,
DTDs and network access off.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from lxml import etree

from substrate.netconf import schema
from substrate.netconf.schema import LOCK, SchemaError

Flat = dict[str, str]
NC_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
OPERATIONS = ("merge", "replace", "create", "delete", "remove", "none")
_PARSER = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, dtd_validation=False,
                          huge_tree=False, remove_blank_text=True, remove_comments=True, remove_pis=True)


class RpcError(Exception):
    """An ``<rpc-error>`` (RFC 6241 section 4.3 and Appendix A).

    Args:
        tag: error-tag (``invalid-value``, ``lock-denied``, ``in-use``, ``operation-failed``, ...).
        message: error-message for a human.
        type: error-type (``transport``, ``rpc``, ``protocol``, ``application``).
        path: error-path (an instance identifier), when the error is about a node.
        info: error-info children (name -> text), e.g. ``{"session-id": "3"}``.
    """

    def __init__(self, tag: str, message: str, *, type: str = "application", path: str | None = None,
                 info: dict[str, str] | None = None, severity: str = "error"):
        self.tag, self.message, self.type, self.path = tag, message, type, path
        self.info, self.severity = info or {}, severity
        super().__init__(f"{tag}: {message}" + (f" (at {path})" if path else ""))


def from_schema_error(e: SchemaError) -> RpcError:
    return RpcError(e.tag, str(e), path=e.path)


def parse_xml(data: bytes | str) -> etree._Element:
    """Parse XML from a peer safely: no DTD (a ``<!DOCTYPE`` is refused outright, so neither an
    entity expansion bomb nor an external entity is ever processed), no network, bounded depth.

    Raises:
        RpcError: ``malformed-message`` (rpc) naming the parser's complaint.
    """
    raw = data.encode() if isinstance(data, str) else data
    if b"<!DOCTYPE" in raw or b"<!ENTITY" in raw:
        raise RpcError("malformed-message", "document type declarations (DTDs, entities) are not allowed in NETCONF",
                       type="rpc")
    try:
        root = etree.fromstring(raw, _PARSER)
    except etree.XMLSyntaxError as e:
        raise RpcError("malformed-message", f"not well-formed XML: {e}", type="rpc") from None
    if root is None:
        raise RpcError("malformed-message", "empty message", type="rpc")
    return root


# -- flat maps <-> XML ----------------------------------------------------------------------------


def _value_text(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "" if v is None else str(v)


def _walk(tree) -> Iterator[tuple[str, str]]:  # noqa: ANN001 - libyang DNode
    """(path, value) of every meaningful node of a libyang tree, in document order; values are
    libyang's canonical strings (``lyd_get_value``; ``""`` for an empty leaf).

    Walks the C nodes directly: wrapping each node in a Python object and asking it for its
    typed value (which re-validates the value) cost most of a device read."""
    from _libyang import ffi, lib

    def path(n) -> str:  # noqa: ANN001
        p = lib.lyd_path(n, lib.LYD_PATH_STD, ffi.NULL, 0)
        try:
            return ffi.string(p).decode()
        finally:
            lib.free(p)

    def value(n) -> str:  # noqa: ANN001
        v = lib.lyd_get_value(n)
        return "" if v == ffi.NULL else ffi.string(v).decode()

    list_, container, leaf, leaflist = lib.LYS_LIST, lib.LYS_CONTAINER, lib.LYS_LEAF, lib.LYS_LEAFLIST
    for top in tree.siblings():
        start = n = top.cdata
        while n != ffi.NULL:
            s = n.schema
            if s != ffi.NULL:
                kind = s.nodetype
                if kind == list_ or (kind == container and s.flags & lib.LYS_PRESENCE):
                    yield path(n), ""
                elif kind == leaflist or (kind == leaf and not s.flags & lib.LYS_KEY):
                    yield path(n), value(n)
            # pre-order: first child, else next sibling, else the next sibling of an ancestor
            nxt = lib.lyd_child(n)
            if nxt == ffi.NULL:
                if n == start:
                    break
                nxt = n.next
            while nxt == ffi.NULL:
                n = n.parent
                if n == ffi.NULL or n == start:
                    break
                nxt = n.next
            if nxt == ffi.NULL:
                break
            n = nxt


def to_flat(xml: str, *, state: bool = False) -> Flat:
    """Parse instance data (top-level elements, no wrapper) into a flat map.

    Args:
        state: accept config-false (state) nodes too.

    Raises:
        SchemaError: the data does not fit the schema (types and structure).
    """
    import libyang

    if not xml.strip():
        return {}
    ctx = schema.context()
    with LOCK:
        try:
            tree = ctx.parse_data_mem(xml, "xml", strict=True, parse_only=True, no_state=not state)
        except libyang.LibyangError as e:
            raise schema._error(e) from None
        if tree is None:
            return {}
        try:
            return dict(_walk(tree))
        finally:
            tree.free()


def _build(flat: Flat):  # noqa: ANN202 - libyang DNode | None
    import libyang

    ctx = schema.context()
    # any node of the tree anchors the next absolute path (libyang finds the top level from it):
    # walking to the first top-level sibling after every path cost most of the build
    anchor = None
    for path, value in flat.items():
        try:
            last = path.rsplit("/", 1)[-1]
            node = ctx.create_data_path(path, parent=anchor, value=None if "[.=" in last or value == "" else value,
                                        force_return_value=False)
        except libyang.LibyangError as e:
            if anchor is not None:
                anchor.root().first_sibling().free()
            err = schema._error(e)
            raise SchemaError(str(err), err.path or path, err.tag) from None
        if anchor is None and node is not None:
            anchor = node
    return anchor.root().first_sibling() if anchor is not None else None


def to_xml(flat: Flat, *, pretty: bool = False) -> str:
    """Print a flat map as XML (top-level elements, no wrapper).

    Raises:
        SchemaError: a path or value does not fit the schema.
    """
    if not flat:
        return ""
    with LOCK:
        tree = _build(flat)
        if tree is None:
            return ""
        try:
            return tree.print_mem("xml", with_siblings=True, pretty=pretty)
        finally:
            tree.free()


#: Digests of data that passed :func:`validate` lately (the same content is validated by the
#: edit-config that makes it and again by validate and commit).
_VALID: OrderedDict[bytes, None] = OrderedDict()
_VALID_KEEP = 64
_VALID_LOCK = threading.Lock()


def validate(flat: Flat) -> None:
    """Full validation of configuration data (types, mandatory nodes, leafrefs, must, when,
    unique, min/max-elements). Content that passed lately is not validated again (the result
    depends on the content alone; it is recognised by a SHA-256 digest of its sorted entries).

    Raises:
        SchemaError: naming the data path.
    """
    h = hashlib.sha256()
    for k, v in sorted(flat.items()):
        h.update(k.encode() + b"\0" + v.encode() + b"\0")
    key = h.digest()
    with _VALID_LOCK:
        if key in _VALID:
            _VALID.move_to_end(key)
            return
    schema.validate_xml(to_xml(flat), semantic=True)
    with _VALID_LOCK:
        _VALID[key] = None
        while len(_VALID) > _VALID_KEEP:
            _VALID.popitem(last=False)


def remove_prefix(flat: Flat, path: str) -> int:
    """Remove ``path`` and everything under it; returns how many entries went."""
    gone = [k for k in flat if k == path or k.startswith(path + "/") or k.startswith(path + "[")]
    for k in gone:
        del flat[k]
    return len(gone)


def exists(flat: Flat, path: str) -> bool:
    return any(k == path or k.startswith(path + "/") or k.startswith(path + "[") for k in flat)


def merge3(base: Flat, cand: Flat, cur: Flat) -> Flat:
    """Three-way merge: ``cur`` with the changes from ``base`` to ``cand`` (entries removed,
    added, changed). List entries removed by the change take what out-of-band writers put under
    them along."""
    out = dict(cur)
    for k in base:
        if k not in cand:
            remove_prefix(out, k) if base[k] == "" and not _is_leaf_list_entry(k) else out.pop(k, None)
    for k, v in cand.items():
        if base.get(k) != v or k not in base:
            out[k] = v
    return out


def _is_leaf_list_entry(path: str) -> bool:
    return path.rsplit("/", 1)[-1].find("[.=") >= 0


# -- edit-config ----------------------------------------------------------------------------------


@dataclass
class EditReport:
    """What an edit-config did: ``errors`` are the ones continued past (continue-on-error)."""

    changed: bool = False
    errors: list[RpcError] = field(default_factory=list)


def _quote(v: str) -> str:
    if "'" not in v:
        return f"'{v}'"
    if '"' not in v:
        return f'"{v}"'
    raise RpcError("invalid-value", "a key or leaf-list value cannot contain both ' and \"")


def _snode_child(parent, elem: etree._Element, mods_by_ns: dict[str, str]):  # noqa: ANN001, ANN202
    """The schema node of ``elem`` under schema node ``parent`` (None: top level)."""
    qn = etree.QName(elem)
    if qn.namespace is None:
        raise RpcError("unknown-namespace", f"element <{qn.localname}> has no namespace", type="application",
                       info={"bad-element": qn.localname})
    mod = mods_by_ns.get(qn.namespace)
    if mod is None:
        raise RpcError("unknown-namespace", f"namespace {qn.namespace!r} is not one of this device's modules",
                       info={"bad-element": qn.localname, "bad-namespace": qn.namespace})
    ctx = schema.context()
    if parent is None:
        for s in ctx.get_module(mod).children():
            if s.name() == qn.localname:
                return s, mod
    else:
        for s in parent.children():
            if s.name() == qn.localname and s.module().name() == mod:
                return s, mod
    raise RpcError("unknown-element", f"<{qn.localname}> ({mod}) is not a child of "
                   f"{'the top level' if parent is None else parent.name()}", info={"bad-element": qn.localname})


def _text(elem: etree._Element, snode, mods_by_ns: dict[str, str]) -> str:  # noqa: ANN001
    """The element's value; identityref ``prefix:name`` with the XML prefix mapped to the module."""
    t = (elem.text or "").strip()
    try:
        base = snode.type().base()
    except Exception:  # noqa: BLE001 - not a typed node
        return t
    import libyang

    if base == libyang.Type.IDENT and ":" in t:
        pfx, _, name = t.partition(":")
        ns = elem.nsmap.get(pfx)
        if ns and ns in mods_by_ns:
            return f"{mods_by_ns[ns]}:{name}"
    return t


def _op_of(elem: etree._Element, inherited: str) -> str:
    op = elem.get(f"{{{NC_NS}}}operation")
    if op is None:
        return inherited
    if op not in OPERATIONS[:-1]:
        raise RpcError("bad-attribute", f"operation {op!r} is not one of merge, replace, create, delete, remove",
                       type="protocol", info={"bad-attribute": "operation", "bad-element": etree.QName(elem).localname})
    return op


def apply_edit(flat: Flat, config: etree._Element, *, default_operation: str = "merge",
               error_option: str = "stop-on-error", schema_only: bool = False,
               check_values: bool = True) -> EditReport:
    """Apply the children of an edit-config ``<config>`` element to ``flat`` in place.

    Operations per RFC 6241 section 7.2 (merge, replace, create, delete, remove; ``none`` as the
    default operation); ``ordered-by user`` entries are appended (no ``insert`` attribute).
    With ``stop-on-error`` or ``rollback-on-error`` nothing changes when anything fails; with
    ``continue-on-error`` the failing top-level elements are skipped and reported.

    Args:
        schema_only: check the edit against the schema alone (elements, namespaces, keys, value
            types, operation attributes), without the data: ``create`` and ``delete`` act as
            ``merge`` and ``remove``, so nothing depends on what ``flat`` holds. A device runs
            this on an empty map before reading itself, so that a malformed edit is refused
            without a device read.
        check_values: build each top-level element's result with libyang to check the types of
            new values (off when a ``schema_only`` pass over the same edit succeeded: the pass
            checked them, and the full build costs a whole device tree per element).

    Raises:
        RpcError: the first error (stop-on-error / rollback-on-error).
    """
    ctx = _EditCtx(mods={ns: name for name, ns in schema.namespaces().items()}, schema_only=schema_only)
    rep = EditReport()
    work = dict(flat)
    with LOCK:
        for top in config:
            if not isinstance(top.tag, str):
                continue
            trial = dict(work)
            try:
                _edit_node(trial, top, None, "", default_operation, ctx)
                if check_values:  # types of the values this element sets: build them (SchemaError names the path)
                    # only those: building the whole result per element made an edit of n top-level
                    # elements cost n builds of everything (500 elements: 33 s, every device's
                    # NETCONF waiting on the schema lock meanwhile)
                    to_xml({k: v for k, v in trial.items() if work.get(k) != v})
            except SchemaError as e:
                err = from_schema_error(e)
                if error_option != "continue-on-error":
                    raise err from None
                rep.errors.append(err)
                continue
            except RpcError as e:
                if error_option != "continue-on-error":
                    raise
                rep.errors.append(e)
                continue
            work = trial
    rep.changed = work != flat
    flat.clear()
    flat.update(work)
    return rep


@dataclass
class _EditCtx:
    """What every step of one edit needs: XML namespace -> module name; whether data-dependent
    checks are off (see :func:`apply_edit`)."""

    mods: dict[str, str]
    schema_only: bool = False


def _edit_node(flat: Flat, elem: etree._Element, sparent, ppath: str, inherited: str,  # noqa: ANN001, C901
               ctx: _EditCtx) -> None:
    import libyang

    snode, mod = _snode_child(sparent, elem, ctx.mods)
    op = _op_of(elem, inherited)
    if ctx.schema_only:
        op = {"create": "merge", "delete": "remove"}.get(op, op)
    if snode.config_false():
        raise RpcError("invalid-value", f"{snode.name()} is state data (config false): it cannot be configured",
                       path=f"{ppath}/{snode.name()}")
    parent_mod = sparent.module().name() if sparent is not None else None
    step = f"{mod}:{snode.name()}" if mod != parent_mod else snode.name()
    path = f"{ppath}/{step}"
    if isinstance(snode, libyang.SList):
        preds = []
        for k in snode.keys():
            kel = [c for c in elem if isinstance(c.tag, str) and etree.QName(c).localname == k.name()]
            if not kel:
                raise RpcError("missing-element", f"list entry {snode.name()} lacks its key {k.name()}",
                               type="protocol", path=path, info={"bad-element": k.name()})
            preds.append(f"[{k.name()}={_quote(_text(kel[0], k, ctx.mods))}]")
        path += "".join(preds)
        path = _canonical(path)
        _container_op(flat, elem, snode, path, op, ctx, marker=True,
                      skip={k.name() for k in snode.keys()})
    elif isinstance(snode, libyang.SContainer):
        _container_op(flat, elem, snode, path, op, ctx, marker=snode.presence())
    elif isinstance(snode, libyang.SLeafList):
        v = _text(elem, snode, ctx.mods)
        path = _canonical(f"{path}[.={_quote(v)}]", value=None)
        _leaf_op(flat, path, path.rsplit("[.=", 1)[1][1:-2] if "[.=" in path else v, op)
    elif isinstance(snode, libyang.SLeaf):
        if snode.is_key():
            return  # part of the list entry's path
        v = _text(elem, snode, ctx.mods)
        if op in ("delete", "remove"):
            _leaf_op(flat, path, "", op)
            return
        canon = _canonical_value(path, v)
        _leaf_op(flat, path, canon, op)
    else:
        raise RpcError("operation-not-supported", f"cannot edit {snode.name()} ({snode.keyword()})", path=path)


def _canonical(path: str, value: str | None = None) -> str:
    """libyang's canonical form of a data path (key values canonicalised)."""
    import libyang

    ctx = schema.context()
    try:
        node = ctx.create_data_path(path, value=value)
    except libyang.LibyangError as e:
        err = schema._error(e)
        raise RpcError(err.tag, str(err), path=err.path or path) from None
    try:
        found = node.find_path(path) if node is not None else None
        return found.path() if found is not None else path
    finally:
        if node is not None:
            node.root().free()


def _canonical_value(path: str, value: str) -> str:
    import libyang

    ctx = schema.context()
    try:
        node = ctx.create_data_path(path, value=value)
    except libyang.LibyangError as e:
        err = schema._error(e)
        raise RpcError(err.tag, str(err), path=err.path or path) from None
    try:
        leaf = node.find_path(path)
        return _value_text(leaf.value()) if leaf is not None else value
    finally:
        node.root().free()


def _leaf_op(flat: Flat, path: str, value: str, op: str) -> None:
    if op == "create" and path in flat:
        raise RpcError("data-exists", "create: the node exists already", path=path)
    if op == "delete" and path not in flat:
        raise RpcError("data-missing", "delete: the node does not exist", path=path)
    if op in ("delete", "remove"):
        flat.pop(path, None)
    elif op in ("merge", "replace", "create"):
        flat[path] = value


def _container_op(flat: Flat, elem: etree._Element, snode, path: str, op: str,  # noqa: ANN001
                  ctx: _EditCtx, *, marker: bool, skip: set[str] | None = None) -> None:
    if op == "create" and exists(flat, path):
        raise RpcError("data-exists", "create: the node exists already", path=path)
    if op == "delete" and not exists(flat, path):
        raise RpcError("data-missing", "delete: the node does not exist", path=path)
    if op in ("delete", "remove"):
        remove_prefix(flat, path)
        return
    if op == "replace":
        remove_prefix(flat, path)
    child_op = "merge" if op in ("replace", "create") else op
    if marker and (op in ("merge", "replace", "create") or (op == "none" and _needs_parent(elem))):
        flat.setdefault(path, "")
    for c in elem:
        if not isinstance(c.tag, str) or (skip and etree.QName(c).localname in skip):
            continue
        _edit_node(flat, c, snode, path, child_op, ctx)
    if op in ("merge", "replace", "create") and not marker and not exists(flat, path):
        pass  # an empty non-presence container is no data


def _needs_parent(elem: etree._Element) -> bool:
    return any(isinstance(d.tag, str) and d.get(f"{{{NC_NS}}}operation") in ("merge", "replace", "create")
               for d in elem.iter())


# -- filters --------------------------------------------------------------------------------------


def _keys_of(elem: etree._Element) -> set[str]:
    """Key leaf names of a list entry element (empty for other elements)."""
    qns = []
    e = elem
    while e is not None and e.getparent() is not None:
        qns.append(etree.QName(e))
        e = e.getparent()
    mods = {ns: name for name, ns in schema.namespaces().items()}
    path, prev = "", None
    for q in reversed(qns):
        mod = mods.get(q.namespace or "")
        if mod is None:
            return set()
        path += f"/{mod}:{q.localname}" if mod != prev else f"/{q.localname}"
        prev = mod
    import libyang

    try:
        with LOCK:
            s = next(schema.context().find_path(path), None)
            return {k.name() for k in s.keys()} if isinstance(s, libyang.SList) else set()
    except (libyang.LibyangError, StopIteration):
        return set()


def subtree_filter(data: etree._Element, flt: etree._Element) -> etree._Element:
    """RFC 6241 section 6 subtree filtering of ``data`` (a ``<data>`` element) by the children of
    ``flt``; returns a new ``<data>`` element."""
    out = etree.Element(data.tag, nsmap=data.nsmap)
    for fc in flt:
        if not isinstance(fc.tag, str):
            continue
        for d in data:
            if _same(d, fc):
                r = _filter_elem(d, fc)
                if r is not None:
                    out.append(r)
    return out


def _same(d: etree._Element, f: etree._Element) -> bool:
    qd, qf = etree.QName(d), etree.QName(f)
    return qd.localname == qf.localname and (qf.namespace is None or qd.namespace == qf.namespace)


def _filter_elem(d: etree._Element, f: etree._Element) -> etree._Element | None:
    kids = [c for c in f if isinstance(c.tag, str)]
    if not kids:
        text = (f.text or "").strip()
        if text and (d.text or "").strip() != text:
            return None
        return copy.deepcopy(d)
    content = [c for c in kids if len(c) == 0 and (c.text or "").strip()]
    others = [c for c in kids if c not in content]
    for cm in content:
        if not any(_same(x, cm) and (x.text or "").strip() == cm.text.strip() for x in d):
            return None
    if not others:
        return copy.deepcopy(d)
    out = etree.Element(d.tag, nsmap=d.nsmap)
    keys = _keys_of(d)
    selected = False
    for x in d:
        if etree.QName(x).localname in keys or any(_same(x, cm) for cm in content):
            out.append(copy.deepcopy(x))
            selected = selected or any(_same(x, fc) for fc in others)
            continue
        for fc in others:
            if _same(x, fc):
                r = _filter_elem(x, fc)
                if r is not None:
                    out.append(r)
                    selected = True
                break
    return out if selected else None


def xpath_select(flat: Flat, select: str, nsmap: dict[str | None, str] | None = None) -> Flat:
    """RFC 6241 section 8.9 XPath filtering, evaluated by libyang on the data: the entries of
    ``flat`` at or under the nodes ``select`` picks (their ancestors and list keys come along when
    printed). Prefixes are module names (``/anibench-kernel:kernel/rule``); XML prefixes declared
    in ``nsmap`` for the models' namespaces are accepted too. An unprefixed step is in the module
    of the step before it (YANG's JSON-style XPath).

    Raises:
        RpcError: ``invalid-value`` for a bad expression.
    """
    import re

    import libyang

    mods = {ns: name for name, ns in schema.namespaces().items()}
    expr = select
    for pfx, ns in (nsmap or {}).items():
        if pfx and ns in mods and pfx != mods[ns]:
            expr = re.sub(rf"(?<![\w.-]){re.escape(pfx)}:", f"{mods[ns]}:", expr)
    if not flat:
        return {}
    with LOCK:
        tree = _build(flat)
        try:
            picked = [n.path() for n in tree.find_all(expr)] if tree is not None else []
        except libyang.LibyangError as e:
            raise RpcError("invalid-value", f"bad XPath {select!r}: {schema._error(e)}") from None
        finally:
            if tree is not None:
                tree.free()
    out: Flat = {}
    for k, v in flat.items():
        if any(k == p or k.startswith(p + "/") or k.startswith(p + "[") for p in picked):
            out[k] = v
    # a picked key leaf or non-presence container: its list entry / container content
    for p in picked:
        if p not in out and not any(k.startswith(p + "/") for k in out):
            parent = p.rsplit("/", 1)[0]
            if parent in flat:
                out[parent] = flat[parent]
    return out
