"""The power-loss harness itself: it catches an unsafe writer and survives LazyFS's deaths."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from .conftest import RESULTS
from .harness import Config, HarnessError, Trials
from .lazyfs import mounted

pytestmark = pytest.mark.root  # LazyFS: root and /dev/fuse
UNSAFE = "tests.powerloss.targets:RenameWithoutFsync"


def _unsafe(tasks: int, cuts: int) -> Config:
    name = f"rename without fsync, {tasks} writer task{'s' if tasks > 1 else ''}"
    return Config(name, UNSAFE, {}, tasks, cuts, retention=False)


@pytest.mark.parametrize("tasks", [1, 50])
def test_a_rename_without_fsync_is_caught_losing_acknowledged_checkpoints(
    tasks: int, lazyfs_binary: Path, tmp_path: Path
) -> None:
    """The writer the seed's file store is (write, rename, no fsync): the first cuts find
    its acknowledged checkpoints gone or empty."""
    result = Trials(_unsafe(tasks, 5), lazyfs_binary, tmp_path, seed=1).run(stop_at_failure=True)
    RESULTS.append(result)
    assert result.acknowledged > 0
    assert result.lost > 0, result.summary()
    assert any("Expecting value" in p for p in result.problems["corrupt"].values())


def test_unsynced_effect_records_are_caught_lost(lazyfs_binary: Path, tmp_path: Path) -> None:
    """The effect check can fail: effect records written without fsync (beside a safe
    store's checkpoints) are found lost or empty by the first cuts."""
    target = "tests.powerloss.targets:EffectsWithoutFsync"
    options = {"backend": "file", "storage": {"use_syncfs": False}}
    config = Config("effects without fsync", target, options, 50, 5, retention=False)
    result = Trials(config, lazyfs_binary, tmp_path, seed=4).run(stop_at_failure=True)
    RESULTS.append(result)
    assert result.acknowledged > 0
    assert result.lost > 0 or result.count("torn") > 0, result.summary()
    assert any("!effect lost or torn" in p for f in result.problems.values() for p in f.values())


class _KillLazyFSOnce(Trials):
    """Kills LazyFS (as its segfaults do) while the first writer runs."""

    killed = False

    def _let_run(self, pid: int, pipe: object) -> None:
        super()._let_run(pid, pipe)  # type: ignore[arg-type]
        if not self.killed and self.fs.proc is not None:
            self.killed = True
            self.fs.proc.send_signal(signal.SIGKILL)
            self.fs.proc.wait(10)


def test_a_lazyfs_death_is_checked_as_a_cut_nobody_chose(
    lazyfs_binary: Path, tmp_path: Path
) -> None:
    """A LazyFS that dies under the writer loses its unsynced data like a power cut: that
    trial is checked (and catches the unsafe writer) but not counted towards the target."""
    trials = _KillLazyFSOnce(_unsafe(1, 2), lazyfs_binary, tmp_path, seed=2)
    result = trials.run()
    RESULTS.append(result)
    assert trials.killed
    assert result.unchosen == 1 and result.cuts == 2
    assert any("died" in why for why in result.lazyfs)
    assert result.lost > 0
    assert not mounted(trials.fs.mount_dir)


def test_a_lazyfs_that_never_mounts_fails_the_run(tmp_path: Path) -> None:
    """No trial without a filesystem to cut: a LazyFS that cannot mount is an error, not a
    run with nothing checked."""
    config = Config("never mounts", UNSAFE, {}, 1, 1)
    with pytest.raises(HarnessError, match="would not mount"):
        Trials(config, Path("/bin/false"), tmp_path, seed=3).run()
