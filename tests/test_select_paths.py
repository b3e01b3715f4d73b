"""`ppfs select` refuses an --out or --workdir it cannot use before the secure run, in one
line with exit code 2, and never leaves a temporary file beside --out."""

import pytest
from ppfs_cli.main import main

GOOD = "a,b,c,y\n" + "".join(f"{i},{(i * 7) % 5},{(i % 3) * 0.5},{i % 2}\n" for i in range(24))


@pytest.fixture
def good_csv(tmp_path):
    p = tmp_path / "good.csv"
    p.write_text(GOOD)
    return p


def _refused(capsys, argv, message):
    rc = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines()
           if not line.startswith("ppfs: engine ")]
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("ppfs: error: ") and message in err[0], err


def test_out_that_is_a_directory_is_refused_before_the_run(good_csv, tmp_path, capsys):
    out = tmp_path / "outdir"
    out.mkdir()
    work = tmp_path / "w"
    _refused(capsys, ["select", str(good_csv), "--label", "y", "--k", "1", "--out", str(out),
                      "--workdir", str(work)], f"--out: {out} is a directory")
    assert not work.exists()  # nothing was started
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.csv", "outdir"]


def test_out_in_a_directory_that_cannot_hold_files_is_refused_before_the_run(
        good_csv, tmp_path, capsys):
    out = good_csv / "reduced.csv"  # its "directory" is a regular file
    work = tmp_path / "w"
    _refused(capsys, ["select", str(good_csv), "--label", "y", "--k", "1", "--out", str(out),
                      "--workdir", str(work)], f"--out: cannot write a file in {good_csv}")
    assert not work.exists()


def test_workdir_that_is_a_file_is_refused(good_csv, tmp_path, capsys):
    work = tmp_path / "afile"
    work.write_text("")
    _refused(capsys, ["select", str(good_csv), "--label", "y", "--k", "1",
                      "--workdir", str(work)], f"--workdir: cannot use {work} as a directory")


def test_out_written_with_no_temporary_file_left(good_csv, tmp_path, capsys):
    out = tmp_path / "reduced.csv"
    rc = main(["select", str(good_csv), "--label", "y", "--k", "1", "--out", str(out),
               "--workdir", str(tmp_path / "w")])
    assert rc == 0, capsys.readouterr().err
    assert out.read_text().splitlines()[0].endswith(",y")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.csv", "reduced.csv", "w"]
