"""The record pipeline: checkpoints to stored bytes and back, one stage per module.

==================  ===============================================================
module              job
==================  ===============================================================
``pipeline``        :class:`RecordCodec`, the one object the manager calls
``stages``          the value stage
``sealing``         the bytes stage: encryption at rest
``registry``        the registered types (``TypeRegistry``) and raw values (``TaggedValue``)
``typed``           typed values <-> their tagged JSON form
``copy``            validated copies of states in the tagged form (the fast path)
``paths``           how errors name a value's path
``jsonwrite``       writing JSON text (reading: :mod:`aiocheckpoint.format.jsonread`)
``v1``              version-1 records
``tree``            trees of blobs: the split, its nodes and memory, the join, version-2
                    records, reused sub-trees, forks (:mod:`aiocheckpoint.codec.tree`)
``sliced``          sliced work: steps that yield between slices, and their drivers
``pacing``          how long large-state saves may hold one turn of the event loop
``sizes``           a lower bound on a value's JSON text, counted without encoding it
``compress``        compressing blobs
``verify``          the writer's limits, applied to what is read
``effects``         effect records: their stored bytes
``fields``          the sealed fields of events and workflow records
``facts``           a record's step, status and time without its state
``lent``            a returned state the sub-tree cache shares, copied when first read
==================  ===============================================================

The bytes these produce are defined in :mod:`aiocheckpoint.format`. This package is the one
door into the pipeline: the rest of aiocheckpoint imports the names below from here, never
from a module inside (a contract in pyproject.toml checks it).
"""

from .copy import json_copy, storable_copy, to_storable
from .effects import EffectRecord, EffectState, Reconciled, decode_effect, encode_effect
from .facts import RecordFacts, plain_record_fields, record_facts, record_fields
from .fields import FieldSealer, is_sealed_text, locked_view, sealed_text_key
from .jsonwrite import int_to_decimal, with_long_ints
from .pacing import Pacer
from .pipeline import RecordCodec
from .reading import TreeSource
from .registry import TaggedValue, TypeRegistry
from .sealing import (
    ENVELOPE_MAGIC,
    KeyProvider,
    Keyring,
    Sealer,
    is_sealed_record,
    sealed_key_id,
    sealer_for,
)
from .stages import DEFAULT_VALUES, TypedValues, ValueStage, View
from .tree.join import join_state
from .tree.peek import Apart, Cut, peek_state
from .tree.split import split_state
from .tree.splitmemory import recovered_memory
from .tree.subtrees import Lineage
from .tree.treediff import diff_trees
from .tree.v2 import decode_checkpoint_v2, encode_checkpoint_v2
from .typed import has_tags
from .v1 import decode_checkpoint, encode_checkpoint

__all__ = [
    "Apart",
    "Cut",
    "DEFAULT_VALUES",
    "ENVELOPE_MAGIC",
    "EffectRecord",
    "EffectState",
    "FieldSealer",
    "KeyProvider",
    "Keyring",
    "Lineage",
    "Pacer",
    "Reconciled",
    "RecordCodec",
    "RecordFacts",
    "Sealer",
    "TaggedValue",
    "TreeSource",
    "TypeRegistry",
    "TypedValues",
    "ValueStage",
    "View",
    "decode_checkpoint",
    "decode_checkpoint_v2",
    "decode_effect",
    "diff_trees",
    "encode_checkpoint",
    "encode_checkpoint_v2",
    "encode_effect",
    "has_tags",
    "int_to_decimal",
    "is_sealed_record",
    "is_sealed_text",
    "join_state",
    "locked_view",
    "json_copy",
    "peek_state",
    "plain_record_fields",
    "record_facts",
    "record_fields",
    "recovered_memory",
    "sealed_key_id",
    "sealed_text_key",
    "sealer_for",
    "split_state",
    "storable_copy",
    "to_storable",
    "with_long_ints",
]
