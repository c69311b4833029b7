"""What a task kind is to the report, in one place: the protocol fields runs must share to share a table, the
tables built from the group's merged rows, the figures drawn from them, and what those figures' captions say. One
module per kind under report/kinds/ fills a Kind; report/registry.py lists them; the generic stages (merged.py,
render.py, html.py) look a group's kind up there instead of branching on its name. The fields that identify a
measured point (for resuming and merging) are the run store's, runs.rows.POINT_FIELDS."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .runs import Group, Run
from .tables import Table


@dataclass(frozen=True)
class Settings:
    """The report's own settings that tables read: the needle / passkey threshold and the valid-length tolerance."""

    threshold: float = 0.8
    tolerance: float = 0.10


@dataclass
class FigureSpace:
    """Where a group's figures go: the folder, the group's file stem, the file names taken so far (a kind that
    draws several figures names each with figures.free_name), the report's settings."""

    out_dir: Path
    stem: str
    taken: set[str]
    settings: Settings

    @property
    def main(self) -> Path:
        """The group's main figure: `<stem>.png`."""
        return self.out_dir / f"{self.stem}.png"


def no_figures(group: Group, space: FigureSpace) -> dict[str, str]:
    """A kind with nothing to draw against the context length (lm-eval's method x task table)."""
    return {}


def no_captions(group: Group, part: str) -> str | None:
    return None


@dataclass(frozen=True)
class Kind:
    """A task kind: `protocol_key(run, aggregate)` -> the fields that must agree (flat, JSON-able);
    `tables(group, rows, settings)` -> the group's tables, its first one the table its main figure draws;
    `figures(group, space)` -> key (`<group id>`, `<group id>-<part>`) -> file name of each figure drawn;
    `caption(group, part)` -> what the figure `<group id>-<part>` shows, or None for the generic text.
    `merges_rows`: False for a kind whose tables read each run whole (tune: one row per search)."""

    name: str
    title: str
    protocol_key: Callable[[Run, str | None], dict[str, Any]]
    tables: Callable[[Group, list[dict[str, Any]], Settings], list[Table]]
    figures: Callable[[Group, FigureSpace], dict[str, str]] = no_figures
    caption: Callable[[Group, str], str | None] = no_captions
    merges_rows: bool = True


__all__ = ["FigureSpace", "Kind", "Settings", "no_captions", "no_figures"]
