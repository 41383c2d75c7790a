"""`once` shows on a terminal which point it is timing and how far it has come, and nothing when piped."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service import fake_config

pytestmark = pytest.mark.slow


def _once(config: Path, *, terminal: bool, json_output: bool = False) -> tuple[int, str]:
    """Run `once` with stderr on a pseudo-terminal (as a person sees it) or a pipe; its stderr as text."""
    args = [
        sys.executable,
        "-m",
        "crossover_monitor",
        "once",
        "--config",
        str(config),
        *(["--json"] if json_output else []),
    ]
    if not terminal:
        done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
        return done.returncode, done.stderr
    leader, follower = pty.openpty()
    with subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=follower) as process:
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            chunks.append(chunk)
        code = process.wait(timeout=120)
    os.close(leader)
    return code, b"".join(chunks).decode(errors="replace")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(fake_config())
    return path


def test_a_terminal_sees_each_point_and_the_count(config: Path) -> None:
    """On a terminal: '[done/total] timing DEVICE n=SIZE DTYPE MODE' lines, counting up to the total."""
    code, stderr = _once(config, terminal=True)
    assert code == 0, stderr
    assert "timing /GPU:0 n=128 float32 end_to_end" in stderr
    # 2 devices x (4 sizes + the n=1 probe) x 2 modes
    assert "[19/20] timing" in stderr
    assert stderr.endswith("\r\x1b[K")  # the line is erased at the end


@pytest.mark.parametrize("json_output", [False, True], ids=["piped", "json-on-a-terminal"])
def test_nothing_extra_when_piped_or_with_json(config: Path, *, json_output: bool) -> None:
    """Piped stderr, or --json, gets no progress lines."""
    code, stderr = _once(config, terminal=json_output, json_output=json_output)
    assert code == 0, stderr
    assert "timing" not in stderr
