"""Hostile store URLs (issue #22, items 10 and 11).

10. A PostgreSQL URL asyncpg cannot parse (a port that is not a number, an empty host, a
    query that is not ``name=value`` pairs) or an option it does not take raised a raw
    ``ValueError``/``TypeError``/``IndexError`` at first use (a CLI traceback), although
    :func:`~aiocheckpoint.open_storage` promises :class:`~aiocheckpoint.InvalidArgumentError`.
    Now ``open_storage`` refuses them, for every scheme; what only the driver can judge is an
    ``InvalidArgumentError`` at first use.
11. A mistyped URL (``postgress://app:PW@host/db``) printed its password in the error. Every
    message that shows a URL now shows :func:`aiocheckpoint.urls.redacted` of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

from aiocheckpoint import CheckpointManager, InvalidArgumentError, StorageBackendError, open_storage
from aiocheckpoint.storage.postgres import PostgresCheckpointStorage
from aiocheckpoint.urls import redacted
from tests.pg_support import DSN, pg_schema

__all__ = ["pg_schema"]

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-Pw"

# --- item 10: validated at open_storage ---------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app@127.0.0.1:notaport/db",
        "postgresql://app@127.0.0.1:99999/db",
        "postgresql://app@127.0.0.1:0/db",
        "postgresql://app@127.0.0.1:\uff15\uff14\uff13\uff12/db",  # not ASCII digits
        "postgresql://app@[::1/db",
        "postgresql://app@[::1]:x/db",
        "postgresql://app@h1,/db",
        "postgres://app@h1:5432,h2:x/db",
        "postgresql://app@h/db?sslmode",
        "postgresql://app@h/db?a=1&&b=2",
        "postgresql://app@h/db?port=x",
        "postgresql://app@h/db?host=h1,",
        "postgresql://app@h/db?sslmode=bogus",
        "postgresql://app@h/db?schema=s&sslmode",
    ],
)
def test_postgres_url_asyncpg_cannot_parse_is_refused_by_open_storage(url: str) -> None:
    """A host, port or query asyncpg would refuse at first use is refused by open_storage,
    and by the store's constructor given it as a DSN."""
    with pytest.raises(InvalidArgumentError, match="accepted forms"):
        open_storage(url)
    with pytest.raises(InvalidArgumentError, match="bad PostgreSQL DSN"):
        PostgresCheckpointStorage(url.replace("schema=s&", ""))


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app@127.0.0.1:5432/db",
        "postgres://app@127.0.0.1/db",
        "postgresql://app:p%40ss%2Fw@db.example/db",
        "postgresql://app@h1:5432,h2:5433/db",
        "postgresql://app@[::1]:5432/db",
        "postgresql://app@[::1]/db",
        "postgresql://app@h:/db",
        "postgresql:///db?host=/var/run/postgresql",
        "postgresql://app@h/db?host=/tmp,/var/run&port=5432,5433",
        "postgresql://app@h/db?sslmode=disable&application_name=x&schema=s1",
        "postgresql://",
    ],
)
def test_postgres_urls_asyncpg_takes_are_accepted(url: str) -> None:
    """The checks refuse nothing asyncpg takes: host lists, IPv6, Unix sockets, settings."""
    assert isinstance(open_storage(url), PostgresCheckpointStorage)


def url_for(scheme: str, tmp_path: Path) -> str:
    return {
        "memory": "memory://",
        "file": f"file://{tmp_path}/store",
        "sqlite": f"sqlite://{tmp_path}/x.db",
        "postgresql": DSN,
        "postgres": DSN.replace("postgresql://", "postgres://"),
    }[scheme]


@pytest.mark.parametrize("scheme", ["memory", "file", "sqlite", "postgresql", "postgres"])
def test_unknown_option_is_refused_by_open_storage_for_every_scheme(
    scheme: str, tmp_path: Path
) -> None:
    """An option the backend does not take is an InvalidArgumentError naming it, at once."""
    with pytest.raises(InvalidArgumentError, match="colour"):
        open_storage(url_for(scheme, tmp_path), colour="blue")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "options",
    [
        {"server_settings": "application_name=x"},
        {"server_settings": {"application_name": 5}},
        {"port": "5432"},
        {"port": 70000},
        {"loop": None},
    ],
)
def test_malformed_postgres_options_are_refused_at_construction(options: dict[str, Any]) -> None:
    """Connection options of the wrong shape are refused before anything connects."""
    with pytest.raises(InvalidArgumentError):
        open_storage(DSN, **options)
    with pytest.raises(InvalidArgumentError):
        PostgresCheckpointStorage(DSN, **options)


async def test_argument_only_the_driver_judges_is_an_invalid_argument_at_first_use(
    pg_schema: str,
) -> None:
    """A value asyncpg refuses when it connects (a non-numeric command_timeout) is an
    InvalidArgumentError from the first call, not a raw ValueError; nothing is stored."""
    storage = open_storage(DSN, schema=pg_schema, command_timeout="soon")
    async with CheckpointManager(storage) as manager:
        with pytest.raises(InvalidArgumentError, match="command_timeout"):
            await manager.create_checkpoint("wf", 0, "a", "completed", {"x": 1})
    async with CheckpointManager(open_storage(DSN, schema=pg_schema)) as manager:
        assert await manager.list_workflows() == []


@pytest.mark.parametrize("scheme", ["file", "sqlite"])
@pytest.mark.parametrize("suffix", ["?mode=ro", "#x"])
def test_query_or_fragment_in_a_path_url_is_refused(
    scheme: str, suffix: str, tmp_path: Path
) -> None:
    """``sqlite:///p.db?mode=ro`` is refused, not opened as a file named ``p.db?mode=ro``."""
    with pytest.raises(InvalidArgumentError, match="query or fragment"):
        open_storage(f"{url_for(scheme, tmp_path)}{suffix}")
    assert not any(tmp_path.iterdir())


async def test_postgres_url_with_schema_and_settings_opens_the_real_store(pg_schema: str) -> None:
    """A URL with a schema and a server setting in its query reaches the server as given."""
    url = f"{DSN}?schema={pg_schema}&application_name=aiocp_hostile_url"
    async with CheckpointManager(open_storage(url)) as manager:
        await manager.create_checkpoint("wf", 0, "a", "completed", {"x": 1})
        assert (await manager.get_checkpoint("wf", 0)).state_snapshot.data == {"x": 1}
        storage = manager.storage
        assert isinstance(storage, PostgresCheckpointStorage) and storage.schema == pg_schema


# --- item 11: no password in any message ---------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgress://app:PW@host/db", "postgress://app:***@host/db"),
        ("postgresql://app@host/db", "postgresql://app@host/db"),
        ("postgresql://:PW@host/db", "postgresql://:***@host/db"),
        ("postgresql://app:p/w@host/db", "postgresql://app:***@host/db"),
        ("postgresql://app:p@w?x@host/db?a=1", "postgresql://app:***@host/db?a=1"),
        (
            "postgresql://app:PW@h/db?application_name=me@x",
            "postgresql://app:***@h/db?application_name=me@x",
        ),
        (
            "postgresql://h/db?password=PW&sslpassword=PW",
            "postgresql://h/db?password=***&sslpassword=***",
        ),
        ("app:PW@host/db", "app:***@host/db"),
        ("host=h password=PW dbname=d", "host=h password=*** dbname=d"),
        ("file:///home/a@b/dir", "file:///home/a@b/dir"),
        ("sqlite:relative/x.db", "sqlite:relative/x.db"),
    ],
)
def test_redacted_masks_every_password(url: str, shown: str) -> None:
    """The user part's password and password= fields are masked; the rest is kept."""
    assert redacted(url) == shown


def failure(url: object, **options: Any) -> BaseException:
    with pytest.raises(InvalidArgumentError) as info:
        open_storage(url, **options)  # type: ignore[arg-type]
    return info.value


def everything_printed(exc: BaseException) -> str:
    """The message, repr and whole traceback (causes included) a program could print."""
    return "".join([str(exc), repr(exc), *traceback.format_exception(exc)])


@pytest.mark.parametrize(
    "url",
    [
        f"postgress://app:{SECRET}@host/db",
        f"app:{SECRET}@host/db",
        f"postgresql://app:{SECRET}@127.0.0.1:notaport/db",
        f"postgresql://app:{SECRET}@[::1/db",
        f"postgresql://app:{SECRET}@h/db?sslmode",
        f"postgresql://app:pa/{SECRET}@h/db",
        f"postgresql://h:x/db?password={SECRET}",
        f"file://app:{SECRET}@host/dir",
        f"sqlite:///tmp/x.db?password={SECRET}",
        f"memory://app:{SECRET}@host",
    ],
)
def test_errors_about_a_url_never_show_its_password(url: str) -> None:
    """Whatever is wrong with a URL, its error (message, repr, traceback) hides the password."""
    assert SECRET not in everything_printed(failure(url))


def test_bad_option_error_hides_the_urls_password() -> None:
    """The error for an option the backend does not take names it, not the password."""
    printed = everything_printed(failure(f"postgresql://app:{SECRET}@h/db", colour="blue"))
    assert SECRET not in printed and "colour" in printed


async def test_connection_failure_hides_the_urls_password() -> None:
    """A store that cannot connect (nothing listens) reports it without the password."""
    storage = open_storage(f"postgresql://app:{SECRET}@127.0.0.1:1/db")
    with pytest.raises(StorageBackendError) as info:
        await storage.load("wf")
    await storage.close()
    assert SECRET not in everything_printed(info.value)


@pytest.mark.parametrize(
    "url",
    [f"postgress://app:{SECRET}@host/db", f"postgresql://app:{SECRET}@127.0.0.1:notaport/db"],
)
def test_cli_reports_a_bad_url_without_traceback_or_password(url: str) -> None:
    """The CLI's error for a mistyped or unparseable URL is one line, without the password."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "aiocheckpoint", "workflows", url],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert SECRET not in result.stdout + result.stderr
    assert "***" in result.stderr
