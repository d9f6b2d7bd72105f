"""Trees of blobs: a large state stored as content-addressed nodes (version-2 records).

==================  ===============================================================
module              job
==================  ===============================================================
``split``           cutting a state into a root and blobs (the writing side)
``nodes``           the nodes a split makes, the sets it adopts whole
``subtrees``        a ``SharedState``'s unchanged sub-trees, reused from the last save
``crc``             CRC-32 of joined texts from their parts'
``join``            rebuilding a state from its blobs (the reading side), verified
``peek``            one part of a state (a path, a page of a large container), the rest unread
``v2``              version-2 records: the fields plus the tree's root
``splitmemory``     what a split remembers per workflow, and its recovery from a store
``fork``            a tree record re-homed under another workflow
==================  ===============================================================

The node format is :mod:`aiocheckpoint.format.tree`'s.
"""
