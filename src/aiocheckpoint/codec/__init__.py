"""The record pipeline: checkpoints to stored bytes and back, one stage per module.

==================  ===============================================================
module              job
==================  ===============================================================
``pipeline``        :class:`RecordCodec`, the one object the manager calls
``stages``          the value stage (and where a bytes stage goes)
``registry``        the registered types (``TypeRegistry``) and raw values (``TaggedValue``)
``typed``           typed values <-> their tagged JSON form
``copy``            validated copies of states in the tagged form (the fast path)
``paths``           how errors name a value's path
``jsontext``        writing JSON text (reading: :mod:`aiocheckpoint.format.jsontext`)
``v1``              version-1 records
``tree``            trees of blobs: the split, its nodes and memory, the join, version-2
                    records, reused sub-trees, forks (:mod:`aiocheckpoint.codec.tree`)
``sliced``          sliced work: steps that yield between slices, and their drivers
``pacing``          how long large-state saves may hold one turn of the event loop
``sizes``           a lower bound on a value's JSON text, counted without encoding it
``compress``        compressing blobs
``verify``          the writer's limits, applied to what is read
==================  ===============================================================

The bytes these produce are defined in :mod:`aiocheckpoint.format`.
"""

from .pipeline import RecordCodec
from .registry import TaggedValue, TypeRegistry
from .stages import BytesStage, TypedValues, ValueStage

__all__ = [
    "BytesStage",
    "RecordCodec",
    "TaggedValue",
    "TypeRegistry",
    "TypedValues",
    "ValueStage",
]
