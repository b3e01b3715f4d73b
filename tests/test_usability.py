"""What a new user meets first: bad CSVs refused in one line before anything starts,
one engine default rule, one set of training flags, a busy port named, piped watch."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ppfs_cli.main import build_parser, main

from ppfs.jobflags import best_engine, train_params_from_flags
from ppfs.step2b import TrainParams
from ppfs.table import read_csv

ROWS = "".join(f"{i},{(i * 7) % 5},{i % 2}\n" for i in range(12))


def _select(tmp_path: Path, capsys: Any, path: Path, *extra: str) -> tuple[int, list[str]]:
    rc = main(["select", str(path), "--label", "y", "--k", "1", "--engine", "mpyc",
               "--workdir", str(tmp_path / "w"), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err


def test_byte_order_mark_is_not_part_of_the_first_name(tmp_path: Path) -> None:
    p = tmp_path / "bom.csv"
    p.write_bytes(b"\xef\xbb\xbfa,b,y\n" + ROWS.encode())
    t = read_csv(p, "y")
    assert t.columns == ("a", "b")
    t = read_csv(p, "a")  # the first column as the label
    assert t.label_column == "a" and t.columns == ("b", "y")


@pytest.mark.parametrize("cell", ["inf", "-Infinity", "1e308", "NaN", "NA"])
def test_unencodable_feature_exits_2_naming_file_column_row(
    tmp_path: Path, capsys: Any, cell: str
) -> None:
    p = tmp_path / "big.csv"
    p.write_text("a,b,y\n" + ROWS.replace("3,1,1\n", f"3,{cell},1\n"))
    rc, err = _select(tmp_path, capsys, p)
    assert rc == 2 and len(err) == 1, err
    assert str(p) in err[0] and "column 'b'" in err[0] and "row 4" in err[0]
    assert not (tmp_path / "w").exists()  # nothing was started


def test_directory_instead_of_csv_exits_2_without_traceback(tmp_path: Path, capsys: Any) -> None:
    d = tmp_path / "data"
    d.mkdir()
    rc, err = _select(tmp_path, capsys, d)
    assert rc == 2 and len(err) == 1
    assert f"{d}: is a directory" in err[0]


def test_missing_label_is_refused_like_a_missing_feature(tmp_path: Path, capsys: Any) -> None:
    p = tmp_path / "na.csv"
    p.write_text("a,b,y\n" + ROWS.replace("3,1,1\n", "3,1,NA\n"))
    rc, err = _select(tmp_path, capsys, p)
    assert rc == 2 and len(err) == 1
    assert "label column 'y', row 4: missing value" in err[0] and str(p) in err[0]


def test_numeric_labels_one_and_one_point_zero_are_one_class(tmp_path: Path) -> None:
    p = tmp_path / "lab.csv"
    p.write_text("a,b,y\n1,2,1\n2,3,1.0\n3,4,0\n4,5,0.0\n5,6,01\n")
    t = read_csv(p, "y")
    assert t.classes == ("0", "1")
    assert t.y.tolist() == [1, 1, 0, 0, 1]
    q = tmp_path / "cat.csv"
    q.write_text("a,b,y\n1,2,yes\n2,3,no\n3,4,yes\n")
    assert read_csv(q, "y").classes == ("no", "yes")  # categorical labels as written


def test_semicolon_separated_file_gets_a_hint(tmp_path: Path, capsys: Any) -> None:
    p = tmp_path / "semi.csv"
    p.write_text("a;b;y\n" + ROWS.replace(",", ";"))
    rc, err = _select(tmp_path, capsys, p)
    assert rc == 2 and len(err) == 1
    assert "semicolon-separated" in err[0] and "comma-separated" in err[0] and str(p) in err[0]


def test_unknown_label_lists_the_columns(tmp_path: Path, capsys: Any) -> None:
    p = tmp_path / "x.csv"
    p.write_text("a,b,Y\n" + ROWS)
    rc, err = _select(tmp_path, capsys, p)
    assert rc == 2 and "label column 'y' is not in the header; did you mean 'Y'?" in err[-1]


# ---- ppfs up on a busy port --------------------------------------------------------------


def test_up_names_a_busy_port(tmp_path: Path, capsys: Any) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        rc = main(["up", "--port", str(port), "--state-dir", str(tmp_path / "st")])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"port {port} is in use; pass --port" in err
    assert not (tmp_path / "st").exists()  # refused before anything was made


# ---- one engine rule ---------------------------------------------------------------------


def test_best_engine_is_the_best_every_party_offers() -> None:
    both, mpyc = ("mp-spdz", "mpyc"), ("mpyc",)
    assert best_engine([both, both, both]) == "mp-spdz"
    assert best_engine([both, mpyc, both]) == "mpyc"
    assert best_engine([both, both, both], "passive-4pc") == "mpyc"  # mp-spdz lacks it
    assert best_engine([both, both, both], "active-3pc") == "mp-spdz"
    assert best_engine([mpyc, mpyc, mpyc], "active-3pc") is None


def _stub_client(engines: list[tuple[str, ...]]) -> Any:
    parties = [SimpleNamespace(name=n, engines=e)
               for n, e in zip(("Alice", "Bob", "Carol"), engines, strict=False)]
    return SimpleNamespace(deployment=lambda: SimpleNamespace(parties=parties))


def test_jobs_submit_defaults_to_what_the_deployment_offers() -> None:
    from ppfs_client.commands import _default_engine

    args = build_parser().parse_args(
        ["jobs", "submit", "--dataset", "d", "--label", "y", "--k", "1"]
    )
    assert args.engine is None  # no fixed default: chosen from /v1/deployment
    assert _default_engine(_stub_client([("mpyc",)] * 3), "passive-3pc") == "mpyc"
    assert _default_engine(_stub_client([("mp-spdz", "mpyc")] * 3), "passive-3pc") == "mp-spdz"
    from ppfs.errors import ParameterError

    with pytest.raises(ParameterError, match="no engine that every party offers runs active-3pc"):
        _default_engine(_stub_client([("mpyc",)] * 3), "active-3pc")


def test_select_default_engine_follows_the_same_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    from ppfs.engines import registry

    monkeypatch.setattr(registry, "engine_unavailable_reason",
                        lambda name: None if name == "mpyc" else "not found")
    assert registry.default_engine_name("passive-3pc") == "mpyc"


# ---- one set of training flags ----------------------------------------------------------

SELECT = ["select", "d.csv", "--label", "y", "--k", "1"]
SUBMIT = ["jobs", "submit", "--dataset", "d", "--label", "y", "--k", "1"]


@pytest.mark.parametrize("base", [SELECT, SUBMIT], ids=["select", "jobs-submit"])
def test_training_flags_same_names_and_defaults(base: list[str]) -> None:
    p = build_parser()
    assert train_params_from_flags(p.parse_args(base)) is None
    assert train_params_from_flags(p.parse_args([*base, "--train"])) == TrainParams()
    got = train_params_from_flags(p.parse_args(
        [*base, "--epochs", "3", "--learning-rate", "0.25", "--batch-size", "16",
         "--train-seed", "5"]))
    assert got == TrainParams(epochs=3, lr=0.25, batch=16, seed=5)
    # the older spellings of `select` keep working
    old = train_params_from_flags(p.parse_args([*base, "--train", "--lr", "0.25", "--batch", "16"]))
    assert old == TrainParams(lr=0.25, batch=16)


def test_training_flags_documented_alike(capsys: Any) -> None:
    helps = []
    for argv in (["select", "--help"], ["jobs", "submit", "--help"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
        helps.append(capsys.readouterr().out)
    for flag in ("--train", "--epochs", "--learning-rate", "--batch-size", "--train-seed"):
        assert all(flag in h for h in helps), flag
    assert all("--lr" not in h and "--batch " not in h for h in helps)  # hidden aliases


# ---- piped jobs watch ---------------------------------------------------------------------


def _job(state: str, *parties: tuple[str, float, str]) -> dict[str, Any]:
    return {"id": "J1", "state": state, "error": "", "parties": [
        {"index": i, "name": n, "state": s, "progress": pr, "phase": s}
        for i, (n, pr, s) in enumerate(parties)]}


def test_piped_watch_prints_one_line_per_change_then_the_next_command(capsys: Any) -> None:
    from ppfs_client.commands import _watch

    events = [
        _job("queued", ("Alice", 0.0, "queued"), ("Bob", 0.0, "queued")),
        _job("queued", ("Alice", 0.0, "queued"), ("Bob", 0.0, "queued")),  # no change
        _job("running", ("Alice", 0.5, "running"), ("Bob", 0.2, "running")),
        _job("succeeded", ("Alice", 1.0, "succeeded"), ("Bob", 1.0, "succeeded")),
    ]
    client = SimpleNamespace(events=lambda job_id: iter(events),
                             get_job=lambda job_id: events[-1])
    assert _watch(client, "J1", as_json=False) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 4, out
    assert out[0].startswith("J1 queued:") and "Alice: queued 0%" in out[0]
    assert "Alice: running 50%" in out[1] and "Bob: running 20%" in out[1]
    assert out[2].startswith("J1 succeeded:")
    assert out[3] == "next: ppfs result fetch J1"


def test_watch_view_is_live_on_a_terminal() -> None:
    import io

    from ppfs_client.progress import JobProgressView

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Tty()
    view = JobProgressView(terminal=term)
    assert view.live
    last = view.follow(iter([_job("running", ("Alice", 0.5, "running")),
                             _job("succeeded", ("Alice", 1.0, "succeeded"))]))
    assert last is not None and last["state"] == "succeeded"
    assert "Alice" in term.getvalue()
    assert not JobProgressView(terminal=io.StringIO()).live


def test_live_view_cuts_a_long_phase_not_the_bar_or_the_times() -> None:
    import io
    import re

    from ppfs_client.progress import JobProgressView

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    phase = "training, 1,200 of 1,875 SGD steps, and then some more words besides"

    def events():  # type: ignore[no-untyped-def]
        for pr in (0.2, 0.4):
            job = _job("running", ("Alice", pr, "running"))
            job["parties"][0]["phase"] = phase
            yield job

    term = Tty()  # rich's default width off a real terminal: 80 columns
    JobProgressView(terminal=term).follow(events())
    lines = [line for line in re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", term.getvalue())
             .replace("\r", "\n").splitlines() if "Alice" in line]
    last = lines[-1]
    assert len(last) <= 80
    assert "━" * 8 in last                              # the bar keeps its width
    assert " 40% " in last and "0:00:0" in last         # percentage and elapsed time
    assert "running: training, 1,200" in last and last.endswith("…")


