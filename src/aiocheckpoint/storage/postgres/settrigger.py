"""Schema version 10: the effect journal follows deleted checkpoints once per statement.

Version 6 deleted a checkpoint's effects from a row trigger: a PL/pgSQL call and a
``DELETE`` per deleted checkpoint, most of what deleting 700,000 steps cost a sweep. Now one
statement trigger deletes the effects of every checkpoint the statement deleted, from its
transition table, in one join. Same outcome, same transaction; it depends on no other new
migration (the trigger's name stays, so a store put back to version 6 migrates again).
"""

from __future__ import annotations

from typing import Final

__all__ = ["MIGRATION"]

MIGRATION: Final[tuple[str, ...]] = (
    "DROP TRIGGER IF EXISTS effects_go_with_checkpoints ON {s}.checkpoints",
    """
    CREATE OR REPLACE FUNCTION {s}.effects_go_with_checkpoints() RETURNS trigger
    LANGUAGE plpgsql AS $$ BEGIN
        DELETE FROM {s}.effects AS x USING gone AS g
        WHERE x.workflow_id = g.workflow_id AND x.step = g.step;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER effects_go_with_checkpoints AFTER DELETE ON {s}.checkpoints
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION {s}.effects_go_with_checkpoints()
    """,
)
