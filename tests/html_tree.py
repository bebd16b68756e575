"""A small HTML tree for tests that look at a page as a browser would structure it (the
report's tables and trajectory pages): built with the standard library's parser, failing on a
mismatched or unclosed tag."""

from __future__ import annotations

from collections.abc import Iterator
from html.parser import HTMLParser

VOID = {"meta", "br", "hr", "img", "input", "link", "area", "base", "col", "source", "wbr"}


class Node:
    def __init__(self, tag: str, attrs: dict[str, str | None], parent: Node | None):
        self.tag, self.attrs, self.parent, self.children, self.text = tag, attrs, parent, [], ""

    def walk(self) -> Iterator[Node]:
        yield self
        for c in self.children:
            yield from c.walk()

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)

    def find(self, tag: str | None = None, cls: str | None = None, id: str | None = None) -> list[Node]:  # noqa: A002
        return [n for n in self.walk() if (tag is None or n.tag == tag) and (id is None or n.attrs.get("id") == id)
                and (cls is None or cls in (n.attrs.get("class") or "").split())]


class TreeBuilder(HTMLParser):
    """Builds a tree and fails on a mismatched end tag (the page must be well-formed)."""

    def __init__(self) -> None:
        super().__init__()
        self.root = self.cur = Node("#root", {}, None)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, dict(attrs), self.cur)
        self.cur.children.append(node)
        if tag not in VOID:
            self.cur = node

    def handle_endtag(self, tag: str) -> None:
        assert self.cur.tag == tag, f"</{tag}> closes <{self.cur.tag}>"
        self.cur = self.cur.parent  # type: ignore[assignment]

    def handle_data(self, data: str) -> None:
        self.cur.text += data


def parse(page: str) -> Node:
    b = TreeBuilder()
    b.feed(page)
    b.close()
    assert b.cur is b.root, f"unclosed <{b.cur.tag}>"
    return b.root
