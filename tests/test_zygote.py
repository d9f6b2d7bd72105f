"""The zygote (tests/_zygote.py) and the CLI tests' command runner (tests/cli_runner.py).

A child forked from the zygote must be what a fresh ``python SCRIPT ARGS`` would be: the same
exit status (SystemExit codes, exceptions, signals), output, stdin, working directory, umask
and environment. Each case runs a probe script both ways, as real processes, and compares.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import cli_runner
from tests._zygote import Zygote
from tests.test_cli import SRC, cli

PROBE = r"""
import atexit, json, os, signal, sys, threading, time

what = sys.argv[1]
if what == "exit":
    sys.exit(None if sys.argv[2] == "none" else int(sys.argv[2]))
if what == "exit-text":
    sys.exit("it went wrong")
if what == "raise":
    raise ValueError("boom")
if what == "interrupt":
    raise KeyboardInterrupt
if what == "signal":
    os.kill(os.getpid(), signal.SIGTERM)
if what == "atexit":
    atexit.register(lambda: print("atexit ran"))
    sys.stdout.write("no newline, not flushed")
if what == "thread":
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread finished"))).start()
if what == "sleep":
    with open(sys.argv[2], "w") as pid:
        pid.write(str(os.getpid()))
    time.sleep(600)
if what == "report":
    umask = os.umask(0)
    print(json.dumps({
        "name": __name__,
        "argv": sys.argv[1:],
        "cwd": os.getcwd(),
        "umask": umask,
        "probe": os.environ.get("AIOCHECKPOINT_PROBE"),
        "stdin": sys.stdin.read() if not sys.stdin.isatty() else "a terminal",
        "streams": [
            [s.name, s.mode, s.encoding, s.errors, s.line_buffering, s.write_through]
            for s in (sys.stdin, sys.stdout, sys.stderr)
        ],
        "same": [sys.stdin is sys.__stdin__, sys.stdout is sys.__stdout__],
    }))
    print("to stderr\r\nline", file=sys.stderr)
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probe script, on disk."""
    path = tmp_path_factory.mktemp("probe") / "probe.py"
    path.write_text(PROBE)
    return path


@pytest.fixture(scope="module")
def zygote(probe: Path) -> Iterator[Zygote]:
    """A zygote that forks the probe script."""
    with Zygote(probe, "json", env=dict(os.environ)) as zygote:
        yield zygote


def both(zygote: Zygote, probe: Path, *args: str, **kwargs: object) -> list[tuple[object, ...]]:
    """``python probe.py ARGS`` as a fresh process and as a child of the zygote."""
    kwargs.setdefault("timeout", 60)
    fresh = subprocess.run(
        [sys.executable, str(probe), *args],
        capture_output=True,
        text=True,
        check=False,
        **kwargs,  # type: ignore[call-overload]
    )
    forked = zygote.run(args, **kwargs)  # type: ignore[arg-type]
    return [(p.returncode, p.stdout, p.stderr) for p in (fresh, forked)]


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("exit", "none"), 0),
        (("exit", "0"), 0),
        (("exit", "7"), 7),
        (("exit", "300"), 300 & 0xFF),
        (("exit-text",), 1),
        (("signal",), -signal.SIGTERM),
        (("atexit",), 0),
        (("thread",), 0),
    ],
)
def test_a_child_ends_as_a_fresh_process_does(
    zygote: Zygote, probe: Path, args: tuple[str, ...], code: int
) -> None:
    """SystemExit codes and messages, signals, KeyboardInterrupt, atexit hooks, unflushed
    output and running threads: the exit code and output are a fresh process's."""
    fresh, forked = both(zygote, probe, *args, stdin=subprocess.DEVNULL)
    assert fresh[0] == code
    assert forked == fresh


def test_an_uncaught_exception_prints_a_traceback_and_exits_1(zygote: Zygote, probe: Path) -> None:
    """The traceback shows the zygote's frames too, so only its end is compared."""
    fresh, forked = both(zygote, probe, "raise", stdin=subprocess.DEVNULL)
    assert fresh[0] == forked[0] == 1
    for result in (fresh, forked):
        assert isinstance(result[2], str)
        assert result[2].startswith("Traceback")
        assert result[2].splitlines()[-1] == "ValueError: boom"


def test_a_child_gets_the_callers_streams_directory_umask_and_environment(
    zygote: Zygote, probe: Path, tmp_path: Path
) -> None:
    """Input on a pipe, another working directory, another umask, a variable the zygote does
    not have: the child sees what a fresh process sees, and its streams are made the same."""
    env = {**os.environ, "AIOCHECKPOINT_PROBE": "\u03b3 value"}
    old = os.umask(0o027)
    try:
        fresh, forked = both(
            zygote, probe, "report", "x y", input="some\ninput", cwd=str(tmp_path), env=env
        )
    finally:
        os.umask(old)
    assert forked == fresh
    report = json.loads(str(fresh[1]))
    assert report["stdin"] == "some\ninput" and report["cwd"] == str(tmp_path)
    assert report["umask"] == 0o027 and report["probe"] == "\u03b3 value"
    assert report["name"] == "__main__" and report["argv"] == ["report", "x y"]
    assert fresh[2] == "to stderr\nline\n"  # newlines translated, as subprocess does


def test_a_terminal_on_stdin_is_a_terminal_in_the_child(zygote: Zygote, probe: Path) -> None:
    master, slave = pty.openpty()
    try:
        fresh, forked = both(zygote, probe, "report", stdin=slave)
    finally:
        os.close(slave)
        os.close(master)
    assert forked == fresh
    assert json.loads(str(fresh[1]))["stdin"] == "a terminal"


@pytest.mark.slow  # it waits out a 5 s timeout (tests/conftest.py's five-second rule)
def test_a_child_past_its_timeout_is_killed_and_the_zygote_carries_on(
    zygote: Zygote, probe: Path, tmp_path: Path
) -> None:
    """As ``subprocess.run``: TimeoutExpired, the child is SIGKILLed; the next call works."""
    pid_file = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run(["sleep", str(pid_file)], stdin=subprocess.DEVNULL, timeout=5)
    assert not alive(int(pid_file.read_text()))
    fresh, forked = both(zygote, probe, "exit", "3", stdin=subprocess.DEVNULL)
    assert forked == fresh == (3, "", "")


def test_the_zygote_reports_the_variables_its_imports_read(tmp_path: Path, probe: Path) -> None:
    """A preloaded module that reads a variable at import time: the zygote names it."""
    (tmp_path / "reads_env.py").write_text('import os\nVALUE = os.environ.get("ODD_PROBE_VAR")\n')
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    with Zygote(probe, "reads_env", env=env) as zygote:
        assert "ODD_PROBE_VAR" in zygote.imported_env


def test_the_cli_reads_its_per_call_variables_when_it_runs() -> None:
    """No variable a call may change (NO_COLOR, AIOCHECKPOINT_*) is read while the CLI and
    the backends are imported: if one were, its calls would go to a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    with Zygote("aiocheckpoint", *cli_runner.PRELOAD, env=env) as zygote:
        assert "HOME" in zygote.imported_env  # the recording works
        assert not [name for name in zygote.imported_env if cli_runner.per_call(name)]


def test_only_per_call_variables_not_read_at_import_may_differ() -> None:
    base = {"HOME": "/home/a", "PATH": "/bin"}
    assert cli_runner.honours(base, frozenset({"HOME"}), base)
    assert cli_runner.honours(base, frozenset(), {**base, "NO_COLOR": "1"})
    assert cli_runner.honours(base, frozenset(), {**base, "AIOCHECKPOINT_KEYS": "k"})
    assert not cli_runner.honours(base, frozenset(), {**base, "HOME": "/home/b"})
    assert not cli_runner.honours(base, frozenset(), {"HOME": "/home/a"})
    assert not cli_runner.honours(base, frozenset({"NO_COLOR"}), {**base, "NO_COLOR": "1"})


def test_cli_calls_take_their_environment_per_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """AIOCHECKPOINT_DEBUG set for one call shows a traceback in that call only."""
    url = f"sqlite:{tmp_path}/missing.db"
    assert "Traceback" not in cli("workflows", url).err
    monkeypatch.setenv("AIOCHECKPOINT_DEBUG", "1")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    debug = cli_runner.run(["workflows", url], env=env, stdin=subprocess.DEVNULL, timeout=120)
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    monkeypatch.delenv("AIOCHECKPOINT_DEBUG")
    assert "Traceback" not in cli("workflows", url).err


def test_the_switch_and_unhonoured_calls_use_a_fresh_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    assert cli_runner.CLI.zygote_for(env, {"stdin": None}) is not None
    assert cli_runner.CLI.zygote_for({**env, "TZ": "Asia/Tokyo"}, {}) is None
    assert cli_runner.CLI.zygote_for(env, {"start_new_session": True}) is None
    monkeypatch.setenv(cli_runner.SWITCH, "1")
    assert cli_runner.CLI.zygote_for(env, {}) is None


def test_no_zygote_outlives_its_test_process(tmp_path: Path) -> None:
    """The zygote ends with the process that started it: at its exit, or at its SIGKILL."""
    script = (
        "import os, subprocess, sys, time\n"
        "from tests import cli_runner\n"
        f"env = {{**os.environ, 'PYTHONPATH': {str(SRC)!r}}}\n"
        "cli_runner.run(['--version'], env=env, stdin=subprocess.DEVNULL, timeout=120)\n"
        "print(cli_runner.CLI.zygote.proc.pid, flush=True)\n"
        "if sys.argv[1] == 'hang': time.sleep(600)\n"
    )
    root = str(Path(__file__).resolve().parent.parent)
    done = subprocess.run(
        [sys.executable, "-c", script, "exit"], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert not alive(int(done.stdout))
    hung = subprocess.Popen(
        [sys.executable, "-c", script, "hang"], cwd=root, stdout=subprocess.PIPE, text=True
    )
    assert hung.stdout is not None
    pid = int(hung.stdout.readline())
    assert alive(pid)
    hung.kill()
    hung.wait()
    deadline = time.monotonic() + 60
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
