"""Ablations within an ANI level, run as settings of their own (draft sections 5.1 and 9).

A level can be complemented by ad-hoc measures that do not change its abstraction -- a blocklist
of known destructive commands added to A1 is the draft's example. The draft treats them as
ablations within the level, to be measured rather than hidden: "generic guardrails and blocklists
can make a level appear safe by tuning to the benchmark". So an ablation is written as part of an
ANI setting, ``LEVEL+ABLATION[+ABLATION...]`` (``A1+blocklist``), and ``--ani A1,A1+blocklist``
replays every task variant with and without it (paired runs), each labelled in the run record
(``level``, ``ablations``) and in the report (the setting).

Adding an ablation is one :class:`Ablation` entry in :data:`ABLATIONS`: the levels that have it,
the :class:`servers.common.ServerConfig` fields it sets for in-process servers, and the
``harness serve`` options that do the same for external agents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from harness.errors import AnibenchError

__all__ = ["ABLATIONS", "Ablation", "AniSetting", "parse_ani_setting", "parse_ani_settings"]

#: Separator between a level and its ablations in a setting (``A1+blocklist``).
SEP = "+"


@dataclass(frozen=True)
class Ablation:
    """A measure added inside a level without changing its abstraction.

    Attributes:
        name: the name written after the level (``blocklist``).
        levels: levels that have it (others refuse it, naming these).
        description: one line for the report and ``--help``.
        server_config: :class:`servers.common.ServerConfig` fields it sets.
        serve_args: ``harness serve`` options that set the same (for agents that start the
            server themselves).
    """

    name: str
    levels: frozenset[str]
    description: str
    server_config: dict[str, Any] = field(default_factory=dict)
    serve_args: tuple[str, ...] = ()


def _blocklist_levels() -> frozenset[str]:
    from servers.registry import BLOCKLIST_LEVELS

    return BLOCKLIST_LEVELS


#: Every ablation, by name.
ABLATIONS: dict[str, Ablation] = {
    "blocklist": Ablation(
        name="blocklist",
        levels=_blocklist_levels(),
        description="the level's blocklist of known destructive commands on top of its allowlist "
                    "(servers/a1_wrapper/blocklist.yaml)",
        server_config={"blocklist": True},
        serve_args=("--blocklist",),
    ),
}


class AniSetting(NamedTuple):
    """One value of ``--ani``: a level and the ablations added to it (in the order written)."""

    level: str
    ablations: tuple[str, ...] = ()

    def __str__(self) -> str:
        return SEP.join((self.level, *self.ablations))

    def server_config(self) -> dict[str, Any]:
        """The :class:`servers.common.ServerConfig` fields the ablations set."""
        out: dict[str, Any] = {}
        for a in self.ablations:
            out |= ABLATIONS[a].server_config
        return out

    def serve_args(self) -> list[str]:
        """The ``harness serve`` options the ablations add."""
        return [arg for a in self.ablations for arg in ABLATIONS[a].serve_args]


def parse_ani_setting(text: str) -> AniSetting:
    """Parse ``LEVEL[+ABLATION...]`` (level matched case-insensitively, ablation names exactly).

    Raises:
        AnibenchError: unknown level (naming the registered ones), unknown ablation (naming the
            known ones), an ablation the level does not have (naming the levels that do), or an
            ablation written twice.
    """
    from servers.registry import normalize_level

    head, *names = [part.strip() for part in text.split(SEP)]
    try:
        level = normalize_level(head)
    except KeyError as e:
        raise AnibenchError(str(e.args[0])) from None
    for name in names:
        ab = ABLATIONS.get(name)
        if ab is None:
            known = "; ".join(f"{a.name} (on {'/'.join(sorted(a.levels))})" for a in ABLATIONS.values())
            raise AnibenchError(f"unknown ablation {name!r} in {text.strip()!r}; known: {known}")
        if level not in ab.levels:
            raise AnibenchError(f"ablation {name!r} applies to {', '.join(sorted(ab.levels))} only, not {level}")
    if len(set(names)) != len(names):
        raise AnibenchError(f"{text.strip()!r} names an ablation twice")
    return AniSetting(level, tuple(names))


def parse_ani_settings(values: list[str]) -> list[AniSetting]:
    """The settings named by ``--ani`` (already split on commas), canonical and in order.

    Shared by ``harness campaign`` and ``harness task validate`` so both refuse the same input.

    Raises:
        AnibenchError: no value, a bad value (see :func:`parse_ani_setting`), or one setting twice.
    """
    if not values:
        raise AnibenchError("--ani needs at least one value")
    settings = [parse_ani_setting(v) for v in values]
    if len(set(settings)) != len(settings):
        raise AnibenchError("--ani lists a value twice")
    return settings
