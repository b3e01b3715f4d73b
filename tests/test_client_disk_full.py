"""The client's disk fills up while it writes a key file, mask words or a kept request:
one `ppfs: error:` line naming the file and the problem (exit 1), no traceback, no
half-written file (an old one left whole), and the same command works once space is
back."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
from ppfs_cli.main import main
from ppfs_client.keys import ClientKeys


def _full(fd: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_key_file_on_a_full_disk_is_named_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "k" / "me.key"
    monkeypatch.setattr(os, "fsync", _full)
    assert main(["keys", "create", "--subject", "analyst-1", "--out", str(out)]) == 1
    monkeypatch.undo()
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ppfs: error:"), captured.err
    assert str(out) in lines[0] and "No space left on device" in lines[0]
    assert "Traceback" not in captured.err and captured.out == ""
    assert not out.exists() and [p.name for p in out.parent.iterdir()] == []
    # space is back: the same command makes the key file
    assert main(["keys", "create", "--subject", "analyst-1", "--out", str(out)]) == 0
    assert ClientKeys.load(out).subject == "analyst-1"


def test_mask_words_on_a_full_disk_leave_the_old_ones_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = ClientKeys.generate("analyst-1").save(tmp_path / "me.key")
    words = np.arange(6, dtype=np.int64).reshape(3, 2)
    path = keys.save_mask_words("m1", words)
    monkeypatch.setattr(os, "fsync", _full)
    with pytest.raises(OSError, match="No space left") as err:
        keys.save_mask_words("m1", np.zeros((3, 2), dtype=np.int64))
    monkeypatch.undo()
    assert err.value.filename == str(path)
    assert np.array_equal(keys.load_mask_words("m1"), words)  # the old words, whole
    assert [p.name for p in path.parent.iterdir()] == ["m1.npy"]
