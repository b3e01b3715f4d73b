"""Showing a job's per-party progress while it runs (`ppfs jobs watch`, `ppfs demo-service`).

On a terminal (stderr): one live line per party (name, progress bar, percentage,
elapsed time, an estimate of the time left, state and phase), redrawn in place with
rich. Otherwise (a pipe, a log file): one plain line on stdout each time something
changed, so a log reads as a history.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

from ppfs_client.terminal import inline

FINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


def party_summary(p: dict[str, Any]) -> str:
    """One party, with what it does within an unfinished state unless that only repeats
    the state: "Alice: queued 1% (compiling)", "Bob: running 40% (ranking)"."""
    shown = p.get("phase") and p["state"] not in FINAL_STATES and p["phase"] != p["state"]
    phase = f" ({inline(p['phase'])})" if shown else ""
    return f"{inline(p['name'])}: {inline(p['state'])} {100 * p['progress']:.0f}%{phase}"


def change_line(job: dict[str, Any]) -> str:
    """One line: the job's state and every party's state, progress and phase."""
    parties = "; ".join(party_summary(p) for p in job["parties"])
    return f"{inline(job['id'])} {inline(job['state'])}: {parties}"


def signature(job: dict[str, Any]) -> tuple[Any, ...]:
    return (job["state"], *((p["state"], p["phase"], round(p["progress"], 2))
                            for p in job["parties"]))


class JobProgressView:
    """Consumes the job's successive states; returns the last one seen."""

    def __init__(self, *, live: bool | None = None, as_json: bool = False,
                 plain: TextIO | None = None, terminal: TextIO | None = None) -> None:
        self.as_json = as_json
        self.terminal = terminal if terminal is not None else sys.stderr
        self.live = (self.terminal.isatty() and not as_json) if live is None else live
        self.stream = (self.terminal if self.live
                       else plain if plain is not None else sys.stdout)
        self.printed: tuple[Any, ...] | None = None  # the last state printed (plain mode)

    def follow(self, events: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
        if self.live:
            return self._follow_live(iter(events))
        return self._follow_plain(events)

    def _follow_plain(self, events: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
        last: dict[str, Any] | None = None
        for job in events:
            last = job
            sig = signature(job)
            if sig == self.printed:
                continue
            self.printed = sig
            line = json.dumps(job) if self.as_json else change_line(job)
            print(line, file=self.stream, flush=True)
        return last

    def _follow_live(self, events: Iterator[dict[str, Any]]) -> dict[str, Any] | None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.table import Column

        last: dict[str, Any] | None = None
        with Progress(
            # what a party or the gateway wrote is shown as text, never read as rich
            # markup (a hyperlink, a colour, or a stray closing tag that stops the watch)
            TextColumn("{task.description:>6}", markup=False),
            BarColumn(bar_width=20),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),  # per party: from its start to its end
            # from the pace of its recent progress (the secure computation's stages are
            # weighted by their cost, so the pace holds roughly steady on MP-SPDZ)
            TimeRemainingColumn(compact=True),
            # the phase takes what width is left, cut short rather than squeezing the rest
            TextColumn("{task.fields[phase]}", markup=False,
                       table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
            console=Console(file=self.stream),
            refresh_per_second=4,
            expand=True,  # the full width: the phase column's ratio takes the rest
        ) as bar:
            tasks: dict[int, Any] = {}
            for job in events:
                last = job
                for p in job["parties"]:
                    i = p["index"]
                    if i not in tasks:
                        tasks[i] = bar.add_task(inline(p["name"]), total=1.0, phase="", start=False)
                    task = bar.tasks[[t.id for t in bar.tasks].index(tasks[i])]
                    if p["state"] not in ("queued", "pending", "") and task.start_time is None:
                        bar.start_task(tasks[i])
                    if p["state"] in FINAL_STATES and task.stop_time is None:
                        bar.stop_task(tasks[i])
                    phase = inline(p["state"] + (f": {p['phase']}" if p.get("phase") else ""))
                    bar.update(tasks[i], completed=p["progress"], phase=phase)
        return last


