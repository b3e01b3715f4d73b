"""`ppfs select` with stderr not a terminal (piped, in a log file) prints its progress as
lines, so that a long run is never silent: one line per new phase, and the secure
computation's own percentage at most once every LINE_SECONDS."""

from pathlib import Path
from typing import Any

from ppfs_cli.main import main

from ppfs.cli import _ProgressDisplay
from ppfs.engines.base import ProgressNote

ROWS = "a,b,c,y\n" + "".join(f"{i},{(i * 7) % 5},{(i % 3) * 0.5},{i % 2}\n" for i in range(16))


def test_piped_select_prints_its_phases(tmp_path: Path, capsys: Any) -> None:
    data = tmp_path / "d.csv"
    data.write_text(ROWS)
    rc = main(["select", str(data), "--label", "y", "--k", "1", "--engine", "mpyc",
               "--workdir", str(tmp_path / "w")])
    out = capsys.readouterr()
    assert rc == 0, out.err
    lines = [line for line in out.err.splitlines() if line.startswith("ppfs: [")]
    assert any(line.endswith("] encoding and secret-sharing the data") for line in lines)
    assert any("] mpyc: " in line for line in lines), lines  # the parties' own phases
    assert len(lines) == len(set(line.split("] ", 1)[1] for line in lines))  # no repeats
    assert "ppfs: [" not in out.out  # the result alone on stdout


def test_json_keeps_stderr_free_of_progress(tmp_path: Path, capsys: Any) -> None:
    data = tmp_path / "d.csv"
    data.write_text(ROWS)
    rc = main(["select", str(data), "--label", "y", "--k", "1", "--engine", "mpyc",
               "--json", "--workdir", str(tmp_path / "w")])
    assert rc == 0
    assert "ppfs: [" not in capsys.readouterr().err


def test_percentages_are_rate_limited(capsys: Any) -> None:
    with _ProgressDisplay(enabled=False, lines=True) as show:
        show("running the secure computation")
        for i in range(200):
            show(ProgressNote(f"comparisons, chunk {i} of 200", i / 200))
        show("secure computation done")
        show("secure computation done")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == [
        "running the secure computation",
        "comparisons, chunk 0 of 200 (0% of the secure computation)",
        "secure computation done",
    ]
