"""A property checked in both tiers: a few examples in the fast tier, many in the slow one.

The fast tier must finish in minutes (tests/conftest.py), and drawing a large random state
costs Hypothesis more than checking it. A property whose examples are expensive runs
``fast`` examples in the fast tier and ``full`` in the slow tier, which CI always runs::

    @examples(fast=40, full=150)
    def test_a_property(examples: int) -> None:
        @settings(max_examples=examples, deadline=None)
        @given(states)
        def check(state: dict[str, Any]) -> None: ...

        check()
"""

from __future__ import annotations

import pytest

__all__ = ["examples"]


def examples(*, fast: int, full: int) -> pytest.MarkDecorator:
    """Parametrize a test's ``examples``: ``fast`` unmarked, ``full`` in the slow tier."""
    assert 0 < fast < full
    return pytest.mark.parametrize(
        "examples",
        [pytest.param(fast, id="fast"), pytest.param(full, marks=pytest.mark.slow, id="full")],
    )
