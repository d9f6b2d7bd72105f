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


def _drops(target: str) -> Config:
    options = {"backend": "file", "storage": {"use_syncfs": False}}
    return Config(target.rsplit(":", 1)[1], target, options, 1, 4)


def test_a_record_whose_fsync_lazyfs_did_not_honour_is_blamed_on_lazyfs(
    lazyfs_binary: Path, tmp_path: Path
) -> None:
    """The writer's audit sees LazyFS's disk without the data of an fsync it answered: what
    the checks then find wrong with that record (and only that record) is LazyFS's failure,
    with the evidence, and that trial does not count as a cut."""
    config = _drops("tests.powerloss.targets:DiskDropsAnFsync")
    result = Trials(config, lazyfs_binary, tmp_path, seed=5).run(stop_at_failure=True)
    RESULTS.append(result)
    assert result.failures == 0, "\n".join([result.summary(), *result.examples()])
    blamed = [why for why in result.lazyfs if why.startswith("fsync not honoured, then")]
    assert blamed, result.lazyfs
    assert all("answered the writer's fsync of" in why and "-all/.tmp-" in why for why in blamed)
    # One record dropped per trial that reached it: no such trial is a cut (LazyFS's own
    # deaths, under load, add uncounted trials too).
    dropped = [why for why in result.lazyfs if why.startswith("fsync not honoured: ")]
    assert dropped and result.unchosen >= len(dropped) and result.cuts == 4


def test_the_same_loss_without_the_audits_evidence_fails(
    lazyfs_binary: Path, tmp_path: Path
) -> None:
    """Control: the same record lost the same way, the audit's report thrown away, is a loss
    of the store's: nothing but the audit's evidence excuses one."""
    config = _drops("tests.powerloss.targets:DiskDropsAnFsyncUnseen")
    result = Trials(config, lazyfs_binary, tmp_path, seed=5).run(stop_at_failure=True)
    RESULTS.append(result)
    assert result.failures > 0, result.summary()
    assert any("0 bytes" in p for found in result.problems.values() for p in found.values())
