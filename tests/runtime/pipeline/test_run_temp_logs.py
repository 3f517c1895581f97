"""Where a run without ``out`` logs: a folder of the user's own in the temp directory, never one
another user of the host made (report sh 6: one shared ``troupe-run-logs`` let its maker read the
others' logs, plant a link where their log file goes, or a record their node acted on)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from troupe.runtime.errors import ConfigError
from troupe.runtime.file_owner import user_name
from troupe.runtime.pipeline.run_plan import make_log_dir, temp_log_dir

NOBODY = 65534  # a uid no test process runs as: "another user of the host"


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system temp directory, here a test's own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_folder_is_the_user_s_own_and_private(temp: Path) -> None:
    logs = temp_log_dir()
    assert logs == temp / f"troupe-run-logs-{os.geteuid()}"
    make_log_dir(logs)
    st = logs.lstat()
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    make_log_dir(logs)  # there already, and fine: the next run's


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a folder to another user")
def test_a_folder_another_user_made_is_refused(temp: Path) -> None:
    logs = temp_log_dir()
    logs.mkdir(mode=0o777)
    os.chmod(logs, 0o777)
    os.chown(logs, NOBODY, NOBODY)
    with pytest.raises(ConfigError) as caught:
        make_log_dir(logs)
    assert str(caught.value) == (
        f"run_pipeline without out logs to {logs}, but it belongs to {user_name(NOBODY)} (mode 0777); "
        "remove it, or pass out=DIR"
    )


def test_a_folder_others_may_write_or_a_link_is_refused(temp: Path) -> None:
    logs = temp_log_dir()
    logs.mkdir()
    os.chmod(logs, 0o777)
    with pytest.raises(ConfigError, match=r"but other users may write it \(mode 0777\); remove it"):
        make_log_dir(logs)
    logs.rmdir()
    (temp / "elsewhere").mkdir(mode=0o700)
    logs.symlink_to(temp / "elsewhere")
    with pytest.raises(ConfigError, match="but it is a symbolic link; remove it, or pass out=DIR"):
        make_log_dir(logs)


def test_an_out_s_log_folder_is_made_as_before(tmp_path: Path) -> None:
    make_log_dir(tmp_path / "out" / "logs")
    assert (tmp_path / "out" / "logs").is_dir()
