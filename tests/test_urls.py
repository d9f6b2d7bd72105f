import pytest

from aiocheckpoint import InMemoryCheckpointStorage, InvalidArgumentError, open_storage


def test_memory_url() -> None:
    """memory:// opens an in-memory store."""
    assert isinstance(open_storage("memory://"), InMemoryCheckpointStorage)


@pytest.mark.parametrize(
    "url",
    ["", "nothing", "ftp://host/x", "memory://x", "file://host/dir", "file:", "sqlite://", 5],
)
def test_bad_urls_name_the_accepted_forms(url: object) -> None:
    """A bad or unknown URL raises one clear error that lists the accepted forms."""
    with pytest.raises(InvalidArgumentError) as info:
        open_storage(url)  # type: ignore[arg-type]
    message = str(info.value)
    assert "accepted forms" in message
    assert "sqlite:///" in message
    assert "\n" not in message


def test_unknown_option_is_a_typed_error() -> None:
    """An option the backend does not take is an InvalidArgumentError, not a TypeError."""
    with pytest.raises(InvalidArgumentError, match="bad option"):
        open_storage("memory://", colour="blue")


def test_postgres_schema_query_parameter() -> None:
    """postgresql://...?schema=NAME picks the schema and leaves the rest of the DSN intact."""
    from aiocheckpoint.urls import _split_schema

    assert _split_schema("postgresql://u@h/db?schema=s1&sslmode=disable") == (
        "postgresql://u@h/db?sslmode=disable",
        "s1",
    )
    assert _split_schema("postgresql://u@h/db") == ("postgresql://u@h/db", None)
