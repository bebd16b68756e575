"""Configuration of one ANI server instance (one run, one lab, one level)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from servers.common.paging import DEFAULT_MAX_MESSAGE_BYTES, MIN_MAX_MESSAGE_BYTES


class ServerConfig(BaseModel):
    """Everything a level builder needs; the harness fills it from the run configuration.

    Level-specific settings go in ``options`` and are validated by the level's own options
    model (e.g. :class:`servers.a1_wrapper.server.A1Options`), so an unknown key is an error
    naming the keys that exist.
    """

    model_config = ConfigDict(extra="forbid")

    lab: str = Field(description="Name of the deployed lab to attach to (Lab.attach).")
    budget_steps: int | None = Field(
        default=None,
        ge=1,
        description="Step budget: most tool calls the server executes (every tools/call counts, errors and "
        "submit included; tools/list does not). None = unlimited.",
    )
    trajectory: Path | None = Field(
        default=None,
        description="Trajectory JSONL file (one line per tool call, fsync'd per line). None = no recording. "
        "An existing file written by the same level on the same lab is continued: its calls count against the "
        "budget and a recorded submit ends the episode; one written by another level or lab is refused.",
    )
    blocklist: bool = Field(
        default=False,
        description="Ablation: add the level's blocklist of destructive commands on top of its allowlist "
        "(draft 5.1: ad-hoc measures inside a level). Levels without a blocklist ignore it.",
    )
    devices: list[str] | Literal["all"] | None = Field(
        default=None,
        description="Devices the agent may act on: None = the lab's routers (P and PE roles), as in campaigns; "
        "'all' = every node, customer and external hosts included; or a list of node names.",
    )
    bearer_token: SecretStr | None = Field(
        default=None,
        description="Streamable-HTTP only: require `Authorization: Bearer <token>` on every request.",
    )
    run_id: str | None = Field(default=None, description="Free label copied into every trajectory line.")
    tool_prefix: str = Field(
        default="",
        pattern=r"^([A-Za-z][A-Za-z0-9_-]{0,31})?$",
        description="Put before every tool name (e.g. 'a1_' gives a1_submit), so that a client attaching two levels "
        "without prefixing names itself does not see two tools of one name. A letter, then at most 31 letters, "
        "digits, '_' or '-' (tool names stay within the 64 characters model APIs accept).",
    )
    max_message_bytes: int = Field(
        default=DEFAULT_MAX_MESSAGE_BYTES,
        ge=MIN_MAX_MESSAGE_BYTES,
        le=64 * 1024 * 1024,
        description="Bound on one JSON-RPC message the server sends (bytes of UTF-8 JSON: a result's text, its "
        "structured copy and the escaping of both). A larger result has its longest texts cut, each with a marker "
        "naming an output id and offset that the read_output tool continues from (servers.common.paging). The "
        "default keeps messages under asyncio's default 64 KiB stdio line limit.",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="Level-specific options.")

    @field_validator("bearer_token")
    @classmethod
    def _token_nonempty(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value().strip():
            raise ValueError("the bearer token is empty: give a real token, or none")
        return v

    @field_validator("devices")
    @classmethod
    def _nonempty(cls, v: list[str] | str | None) -> list[str] | str | None:
        if v is not None and not v:
            raise ValueError("devices must name at least one device (or be left out for the routers, or 'all')")
        return v
