"""Encryption at rest: the bytes stage that seals records and effect records.

``docs/encryption.md`` is the threat model. A sealed *envelope*::

    offset size  field
    0      4     magic  b"ACKX"
    4      1     envelope version (1)
    5      1     kind (1: a checkpoint record, 2: an effect record, 3: a blob, 4: a field's
                 text: an event's or a workflow record's, :mod:`aiocheckpoint.codec.fields`)
    6      1     key id length k (1..255)
    7      k     key id, UTF-8
    .      2     wrapped data key length w, big-endian
    .      w     the data key wrapped by the key provider under that key id
    .      12    nonce: 4 random bytes per data key, then a 64-bit counter
    .      ...   AES-256-GCM ciphertext of the plain record, with its 16-byte tag

The associated data is every byte before the ciphertext, then the workflow id, the step
and (for an effect) its key (for a field's text: the workflow id, step 0 and the field's
label), so a sealed record authenticates only where it was written.
A sealed checkpoint record keeps the 20-byte record header in front of the envelope
(format version 1, flags :data:`FLAG_SEALED`, the body's CRC-32 field 0: the tag
authenticates every byte): backends still read the version byte, and a reader without this
stage refuses the unknown flag. A sealed effect record is the bare
envelope. What is sealed is the whole plain record, header and checksum included, so
unsealing hands the ordinary decoder exactly what it reads without encryption.

An encrypted tree (an incremental checkpoint) names its nodes by HMAC under a name key
(:meth:`Sealer.name_key`), seals each blob with its name and the names it references as
associated data, and seals its version-2 record with the root's references in the clear
(:mod:`aiocheckpoint.format.sealed` holds both layouts, which backends read).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import os
import stat
import struct
from collections import OrderedDict
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar, runtime_checkable

import anyio.lowlevel
import anyio.to_thread

from ..errors import (
    CheckpointError,
    DecryptionError,
    EncryptionError,
    InvalidArgumentError,
    PlaintextRecordError,
    UnknownKeyError,
)
from ..format.header import FORMAT_VERSION, FORMAT_VERSION_2, HEADER, HEADER_SIZE, MAGIC
from ..format.sealed import (
    BLOB_SEALED,
    FLAG_REFS,
    FLAG_SEALED,
    blob_refs_end,
    is_sealed_tree_record,
    refs_block,
    tree_refs_end,
)
from ..format.tree import SplitResult

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "FLAG_SEALED",
    "KIND_CHECKPOINT",
    "KIND_EFFECT",
    "KeyProvider",
    "Keyring",
    "Sealer",
    "is_sealed_record",
    "sealed_key_id",
    "sealer_for",
]

KIND_CHECKPOINT: Final = 1
KIND_EFFECT: Final = 2
#: A node of an encrypted tree (a blob), sealed under its keyed name.
KIND_BLOB: Final = 3
#: The text of one field of a workflow's record or events, sealed under its label.
KIND_TEXT: Final = 4
ENVELOPE_MAGIC: Final = b"ACKX"
_VERSION: Final = 1
_NONCE: Final = 12
_TAG: Final = 16
KEY_SIZE: Final = 32
#: Records above this size are sealed and unsealed in a worker thread (~1 ms per MB).
_ON_LOOP: Final = 1 << 20
#: A data key seals at most this many records (random 96-bit nonces: far below 2**32).
_KEY_USES: Final = 1 << 30
#: Unwrapped data keys a reader keeps (one per writing manager instance seen).
_CACHED_KEYS: Final = 256
_WRAP_AD: Final = b"aiocheckpoint data key\x00"
#: What a key is HMACed with to derive the key that names an encrypted tree's blobs.
_NAMES_INFO: Final = b"aiocheckpoint blob names\x00"
#: Sealing many blobs: the loop gets a turn after about this many bytes.
_SLICE: Final = 256 * 1024
#: The sealed blobs a sealer keeps for the next saves (bytes, least recently used dropped).
_SEALED_CACHE: Final = 16 << 20
_EXTRA: Final = "pip install 'aiocheckpoint[crypto]'"
#: A keys file is small: anything larger is not one.
_KEYS_FILE_BYTES: Final = 1 << 20
_KEYS_SHAPE: Final = '{"primary": ID, "keys": {ID: BASE64 of 32 bytes, ...}}'
_U16: Final = struct.Struct(">H")
_U64: Final = struct.Struct(">Q")
_T = TypeVar("_T")


def _aesgcm() -> type[AESGCM]:
    """The AESGCM class; EncryptionError naming the extra when cryptography is missing."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:
        raise EncryptionError(f"encryption needs the cryptography package: {_EXTRA}") from exc
    return AESGCM


@runtime_checkable
class KeyProvider(Protocol):
    """Wraps and unwraps data keys (envelope encryption): a keyring, or a KMS client.

    ``wrap_key`` encrypts a fresh 32-byte data key under the primary key and returns that
    key's id with the wrapped bytes; ``unwrap_key`` gives the data key back, raising
    :class:`~aiocheckpoint.UnknownKeyError` for a key id it does not hold and
    :class:`~aiocheckpoint.DecryptionError` when the wrapped bytes do not authenticate.
    Each manager wraps one data key when it first writes, and unwraps each data key it
    reads once.
    """

    @property
    def primary(self) -> str:
        """The id of the key new data keys are wrapped under."""
        ...

    async def wrap_key(self, data_key: bytes) -> tuple[str, bytes]:
        """``(key_id, wrapped)`` for a new data key."""
        ...

    async def unwrap_key(self, key_id: str, wrapped: bytes) -> bytes:
        """The data key that ``wrap_key`` wrapped under ``key_id``."""
        ...


class Keyring:
    """Named 32-byte keys, one of them the ``primary`` that new records are written under.

    ``Keyring(keys={"k2": new, "k1": old}, primary="k2")``: records under any of the keys
    read; keys are raw bytes (``os.urandom(32)``, or from a secrets manager). The local
    :class:`KeyProvider`: it wraps data keys with AES-256-GCM under the primary key.
    Bad keys raise :class:`~aiocheckpoint.InvalidArgumentError`.
    """

    __slots__ = ("_keys", "_names", "_primary")

    def __init__(self, keys: dict[str, bytes], primary: str) -> None:
        if not isinstance(keys, dict) or not keys:
            raise InvalidArgumentError("keys must be a non-empty dict of key id -> 32 bytes")
        aesgcm = _aesgcm()
        self._keys = {_key_id(name): aesgcm(_key_bytes(name, key)) for name, key in keys.items()}
        if not isinstance(primary, str) or primary not in keys:
            raise InvalidArgumentError(f"primary {primary!r} is not one of the keyring's ids")
        self._primary = primary
        self._names = hmac.digest(keys[primary], _NAMES_INFO + primary.encode(), "sha256")

    @property
    def primary(self) -> str:
        """The id of the key new records are written under."""
        return self._primary

    @property
    def key_ids(self) -> frozenset[str]:
        """The ids of every key this keyring holds."""
        return frozenset(self._keys)

    def __repr__(self) -> str:
        return f"Keyring(key_ids={sorted(self._keys)!r}, primary={self._primary!r})"

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Keyring:
        """The keyring a keys file holds: the one loader of the command line's ``--keys``.

        A keys file is JSON, ``{"primary": "k2", "keys": {"k2": "<base64>", "k1":
        "<base64>"}}``, each key 32 bytes in standard base64, and must be private to its
        owner (no group or other permission bits: a key readable by others is no secret).
        A file that cannot be read, is shared, or is not that shape raises
        :class:`~aiocheckpoint.InvalidArgumentError` naming the file, never its text.
        Reads the file (blocking, a few KiB): call it at start-up, not on a running loop.
        """
        name = os.fsdecode(path)
        try:
            with open(path, "rb") as fh:
                if stat.S_IMODE(os.fstat(fh.fileno()).st_mode) & 0o077:
                    raise InvalidArgumentError(
                        f"keys file {name} may be read by others (chmod 600 {name})"
                    )
                text = fh.read(_KEYS_FILE_BYTES + 1)
        except OSError as exc:
            raise InvalidArgumentError(f"cannot read keys file {name}: {exc.strerror}") from None
        if len(text) > _KEYS_FILE_BYTES:
            raise InvalidArgumentError(f"keys file {name} is too large to be one")
        return cls.from_json(text, source=f"keys file {name}")

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "keys") -> Keyring:
        """The keyring of a keys file's JSON text (see :meth:`from_file`).

        Errors are :class:`~aiocheckpoint.InvalidArgumentError` starting with ``source``;
        they name what is wrong, never a key.
        """
        try:
            obj: Any = json.loads(text)
            keys = {name: _base64_key(value) for name, value in obj["keys"].items()}
            return cls(keys=keys, primary=obj["primary"])
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{source}: {exc}") from None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise InvalidArgumentError(
                f"{source} is not {_KEYS_SHAPE}: {type(exc).__name__}: {_json_reason(exc)}"
            ) from None

    async def wrap_key(self, data_key: bytes) -> tuple[str, bytes]:
        """See :meth:`KeyProvider.wrap_key`."""
        nonce = os.urandom(_NONCE)
        ad = _WRAP_AD + self._primary.encode()
        return self._primary, nonce + self._keys[self._primary].encrypt(nonce, data_key, ad)

    async def blob_name_key(self) -> bytes:
        """The key that names an encrypted tree's blobs: derived from the primary key.

        Optional for a :class:`KeyProvider` (``docs/encryption.md``): without it, names
        are keyed per data key, so blobs deduplicate only within one manager.
        """
        return self._names

    async def unwrap_key(self, key_id: str, wrapped: bytes) -> bytes:
        """See :meth:`KeyProvider.unwrap_key`."""
        aead = self._keys.get(key_id)
        if aead is None:
            raise UnknownKeyError(key_id)
        try:
            return aead.decrypt(wrapped[:_NONCE], wrapped[_NONCE:], _WRAP_AD + key_id.encode())
        except Exception as exc:  # InvalidTag, or a nonce of the wrong size
            raise DecryptionError(f"the data key does not authenticate under {key_id!r}") from exc


def _base64_key(value: Any) -> bytes:
    if not isinstance(value, str):
        raise TypeError("a key is base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise ValueError("a key is not base64") from None


def _json_reason(exc: Exception) -> str:
    """What went wrong, never the file's text (a JSON error names only a position)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return str(exc)[:200]


def _key_id(name: object) -> str:
    if not isinstance(name, str) or not 1 <= len(name.encode("utf-8", "replace")) <= 255:
        raise InvalidArgumentError(f"a key id must be a str of 1..255 UTF-8 bytes: {name!r}")
    if not name.isprintable():
        raise InvalidArgumentError(f"a key id must be printable: {name!r}")
    return name


def _key_bytes(name: str, key: object) -> bytes:
    if not isinstance(key, bytes) or len(key) != KEY_SIZE:
        size = len(key) if isinstance(key, bytes) else type(key).__name__
        raise InvalidArgumentError(f"key {name!r} must be {KEY_SIZE} bytes, not {size}")
    return key


def sealer_for(encryption: KeyProvider | None, allow_plaintext: Any) -> Sealer | None:
    """The bytes stage of a manager's ``encryption=`` (``docs/encryption.md``), or None."""
    if type(allow_plaintext) is not bool:
        raise InvalidArgumentError(f"allow_plaintext must be a bool, got {allow_plaintext!r}")
    if encryption is None:
        if allow_plaintext:
            raise InvalidArgumentError("allow_plaintext=True needs encryption=")
        return None
    return Sealer(encryption, allow_plaintext=allow_plaintext)


def is_sealed_record(data: bytes) -> bool:
    """Whether a checkpoint record is sealed (a whole record or a tree record).

    A whole record needs both its sealed flag and an envelope after its header, so that a
    flipped bit in a plain record's flags is reported as the corruption it is, not as a
    record that needs keys.
    """
    if len(data) > 5 and data[:4] == MAGIC and data[4] == FORMAT_VERSION:
        return data[5] == FLAG_SEALED and data[HEADER_SIZE : HEADER_SIZE + 4] == ENVELOPE_MAGIC
    return is_sealed_tree_record(data)


def sealed_key_id(data: bytes, *, effect: bool = False) -> str | None:
    """The key id a sealed checkpoint (or ``effect``) record names; None for plaintext.

    Only what the record says: it is not authenticated until it is unsealed.
    """
    if effect:
        envelope = data if data.startswith(ENVELOPE_MAGIC) else b""
    elif is_sealed_tree_record(data):
        try:
            envelope = data[tree_refs_end(data)[2] :]
        except CheckpointError:
            envelope = b""
    else:
        envelope = data[HEADER_SIZE:] if is_sealed_record(data) else b""
    if len(envelope) < 7:
        return None
    return envelope[7 : 7 + envelope[6]].decode("utf-8", "replace")


class _Writing:
    """The data key a manager seals with: its envelope heads, its cipher, its nonces.

    A data key is this object's alone, so a counter makes its nonces unique; the random
    prefix keeps two data keys' nonce sequences apart should a key ever repeat.
    """

    __slots__ = ("aead", "heads", "names", "prefix", "uses")

    def __init__(self, key_id: str, wrapped: bytes, aead: AESGCM, names: bytes) -> None:
        name = key_id.encode()
        ident = bytes([len(name)]) + name + _U16.pack(len(wrapped)) + wrapped
        self.heads = {
            kind: ENVELOPE_MAGIC + bytes((_VERSION, kind)) + ident
            for kind in (KIND_CHECKPOINT, KIND_EFFECT, KIND_BLOB, KIND_TEXT)
        }
        self.prefix = os.urandom(4)
        self.aead = aead
        #: A key for blob names derived from this data key (for providers without one).
        self.names = names
        self.uses = 0

    def nonce(self) -> bytes:
        """The next nonce: taken on the event loop, so no two seals ever share one."""
        self.uses += 1
        return self.prefix + _U64.pack(self.uses)

    def seal(self, kind: int, context: bytes, plain: bytes, nonce: bytes) -> bytes:
        """The envelope of ``plain`` for ``context`` (any thread: it changes nothing)."""
        head = self.heads[kind] + nonce
        return head + self.aead.encrypt(nonce, plain, head + context)


class Sealer:
    """Seals records under a provider's data key and unseals them (the bytes stage).

    ``allow_plaintext`` lets plaintext records read (migrating a store); without it they
    raise :class:`~aiocheckpoint.PlaintextRecordError`.
    """

    def __init__(self, provider: KeyProvider, *, allow_plaintext: bool = False) -> None:
        if not isinstance(provider, KeyProvider):
            raise InvalidArgumentError(
                f"encryption must be a Keyring or a KeyProvider, not {type(provider).__name__}"
            )
        self._aesgcm = _aesgcm()
        self.provider = provider
        self.allow_plaintext = allow_plaintext
        self._writing: _Writing | None = None
        self._reading: OrderedDict[bytes, AESGCM] = OrderedDict()
        self._name_key: bytes | None = None
        # Blobs sealed lately, by name: a save hands the store every blob of its tree, and
        # most are the last save's. Sealing them again would cost a pass over the state.
        self._sealed_blobs: OrderedDict[bytes, bytes] = OrderedDict()
        self._sealed_bytes = 0

    async def seal_record(self, workflow_id: str, step: int, record: bytes) -> bytes:
        """A plain checkpoint record sealed for ``workflow_id``/``step``."""
        context = _context(workflow_id, step, None)
        writing = self._writing
        if writing is None or writing.uses >= _KEY_USES or len(record) > _ON_LOOP:
            envelope = await self._seal(KIND_CHECKPOINT, context, record)
        else:  # the hot path: no further await
            envelope = writing.seal(KIND_CHECKPOINT, context, record, writing.nonce())
        return HEADER.pack(MAGIC, FORMAT_VERSION, FLAG_SEALED, 0, len(envelope), 0) + envelope

    async def name_key(self) -> bytes:
        """The key that names the blobs of the trees this sealer writes (32 bytes).

        The provider's ``blob_name_key()`` if it has one (a :class:`Keyring` derives it
        from its primary key), else one derived from this sealer's data key.
        """
        if self._name_key is None:
            source = getattr(self.provider, "blob_name_key", None)
            if source is not None:
                key = await self._provider_call(source())
            else:
                key = (await self._current()).names
            if not isinstance(key, bytes) or len(key) != KEY_SIZE:
                raise EncryptionError("the key provider's blob_name_key() is not 32 bytes")
            self._name_key = key
        return self._name_key

    async def seal_tree(
        self, workflow_id: str, step: int, record: bytes, split: SplitResult, digest: int
    ) -> tuple[bytes, SplitResult]:
        """A plain version-2 record and its split's new blobs, sealed.

        The record keeps its root's references in the clear and each blob its children's
        names (what a backend counts), both authenticated with the sealed bytes; a blob is
        sealed under its name, so a blob moved to another name fails to open.
        """
        sealed_record = await self.seal_tree_record(
            workflow_id, step, record, digest, split.root_refs
        )
        blobs: dict[bytes, bytes] = {}
        cache = self._sealed_blobs
        budget = _SLICE
        for name, blob in split.blobs.items():
            done = cache.get(name)
            if done is not None:  # a name is its content: sealed once, stored as it was
                cache.move_to_end(name)
                blobs[name] = done
                continue
            blobs[name] = done = await self._seal_blob(name, split.children.get(name, ()), blob)
            self._keep_sealed(name, done)
            budget -= len(blob)
            if budget < 0:
                budget = _SLICE
                await anyio.lowlevel.checkpoint()
        sealed = SplitResult(b"", blobs, split.children, split.root_refs, None, split.memory)
        return sealed_record, sealed

    async def seal_tree_record(
        self, workflow_id: str, step: int, record: bytes, digest: int, refs: tuple[bytes, ...]
    ) -> bytes:
        """A plain version-2 record sealed, its root's references ``refs`` in the clear."""
        clear = bytes((digest,)) + refs_block(refs)
        context = _context(workflow_id, step, None) + clear
        envelope = await self._seal(KIND_CHECKPOINT, context, record)
        length = len(clear) + len(envelope)
        head = HEADER.pack(MAGIC, FORMAT_VERSION_2, FLAG_SEALED | FLAG_REFS, 0, length, 0)
        return head + clear + envelope

    def _keep_sealed(self, name: bytes, sealed: bytes) -> None:
        """Keep a blob sealed for the next saves (they hold it too, mostly), within a bound."""
        if len(sealed) > _SEALED_CACHE // 16:
            return
        cache = self._sealed_blobs
        cache[name] = sealed
        self._sealed_bytes += len(sealed)
        while self._sealed_bytes > _SEALED_CACHE:
            _, dropped = cache.popitem(last=False)
            self._sealed_bytes -= len(dropped)

    async def _seal_blob(self, name: bytes, children: tuple[bytes, ...], blob: bytes) -> bytes:
        clear = bytes((BLOB_SEALED,)) + refs_block(children)
        writing = await self._current()
        nonce = writing.nonce()
        if len(blob) > _ON_LOOP:
            sealed = await anyio.to_thread.run_sync(
                writing.seal, KIND_BLOB, clear + name, blob, nonce
            )
        else:
            sealed = writing.seal(KIND_BLOB, clear + name, blob, nonce)
        return clear + sealed

    async def unseal_blobs(self, found: Mapping[bytes, bytes], digest: int) -> dict[bytes, bytes]:
        """The plain blobs of sealed ones fetched by name; DecryptionError if one fails.

        A plaintext blob in an encrypted tree is refused whatever ``allow_plaintext`` says:
        its name is keyed, so it was never written as it is.
        """
        out: dict[bytes, bytes] = {}
        budget = _SLICE
        for name, stored in found.items():
            try:
                _children, start = blob_refs_end(stored, digest)
            except CheckpointError:
                raise DecryptionError(f"blob {name.hex()} is not sealed") from None
            out[name] = await self._open(KIND_BLOB, stored[:start] + name, stored[start:])
            budget -= len(stored)
            if budget < 0:
                budget = _SLICE
                await anyio.lowlevel.checkpoint()
        return out

    async def _current(self) -> _Writing:
        """The data key to seal with, a new one when there is none or it is used up."""
        writing = self._writing
        if writing is None or writing.uses >= _KEY_USES:
            writing = await self._new_data_key()
        return writing

    async def seal_effect(self, workflow_id: str, step: int, key: str, record: bytes) -> bytes:
        """A plain effect record sealed for its workflow, step and key."""
        return await self._seal(KIND_EFFECT, _context(workflow_id, step, key), record)

    async def unseal_record(self, workflow_id: str, step: int, data: bytes) -> bytes:
        """The plain record a stored checkpoint record holds; DecryptionError if it fails."""
        if not is_sealed_record(data):
            return self._plaintext(data, workflow_id, step, "checkpoint record")
        if is_sealed_tree_record(data):
            return await self._unseal_tree(workflow_id, step, data)
        try:
            _magic, _version, flags, reserved, length, crc = HEADER.unpack_from(data)
            envelope = data[HEADER_SIZE:]
            _check(flags == FLAG_SEALED and reserved == 0, f"unknown record flags {flags:#x}")
            _check(len(envelope) == length, "sealed record truncated or padded")
            _check(crc == 0, "the checksum field of a sealed record is not zero")
            return await self._open(KIND_CHECKPOINT, _context(workflow_id, step, None), envelope)
        except DecryptionError as exc:
            raise type(exc)(exc.reason, workflow_id=workflow_id, step=step) from exc
        except UnknownKeyError as exc:
            raise exc.located(workflow_id, step) from None

    async def _unseal_tree(self, workflow_id: str, step: int, data: bytes) -> bytes:
        """The plain version-2 record a sealed tree record holds (its clear refs checked)."""
        try:
            _check(HEADER.unpack_from(data)[5] == 0, "a sealed record's checksum field is not 0")
            try:
                _digest, _refs, start = tree_refs_end(data)
            except CheckpointError as exc:
                raise DecryptionError(str(exc)) from None
            context = _context(workflow_id, step, None) + data[HEADER_SIZE:start]
            return await self._open(KIND_CHECKPOINT, context, data[start:])
        except DecryptionError as exc:
            raise type(exc)(exc.reason, workflow_id=workflow_id, step=step) from exc
        except UnknownKeyError as exc:
            raise exc.located(workflow_id, step) from None

    async def unseal_effect(self, workflow_id: str, step: int, key: str, data: bytes) -> bytes:
        """The plain effect record stored bytes hold; DecryptionError if they fail."""
        if not data.startswith(ENVELOPE_MAGIC):
            return self._plaintext(data, workflow_id, step, f"effect record {key!r}")
        try:
            return await self._open(KIND_EFFECT, _context(workflow_id, step, key), data)
        except DecryptionError as exc:
            reason = f"effect {key!r}: {exc.reason}"
            raise type(exc)(reason, workflow_id=workflow_id, step=step) from exc
        except UnknownKeyError as exc:
            raise exc.located(workflow_id, step, key) from None

    async def seal_text(self, workflow_id: str, label: str, plain: bytes) -> bytes:
        """A field's text sealed for ``workflow_id`` under ``label`` (what the field is)."""
        return await self._seal(KIND_TEXT, _context(workflow_id, 0, label), plain)

    async def unseal_text(self, workflow_id: str, label: str, data: bytes) -> bytes:
        """The plain text of a sealed field; DecryptionError if it does not authenticate."""
        try:
            return await self._open(KIND_TEXT, _context(workflow_id, 0, label), data)
        except DecryptionError as exc:
            raise type(exc)(f"{label}: {exc.reason}", workflow_id=workflow_id) from exc
        except UnknownKeyError as exc:
            raise UnknownKeyError(exc.key_id, workflow_id=workflow_id) from None

    def _plaintext(self, data: bytes, workflow_id: str, step: int, what: str) -> bytes:
        if self.allow_plaintext:
            return data
        raise PlaintextRecordError(
            f"{what} is not encrypted (pass allow_plaintext=True only to migrate a store)",
            workflow_id=workflow_id,
            step=step,
        )

    async def _seal(self, kind: int, context: bytes, plain: bytes) -> bytes:
        writing = await self._current()
        nonce = writing.nonce()
        if len(plain) > _ON_LOOP:
            return await anyio.to_thread.run_sync(writing.seal, kind, context, plain, nonce)
        return writing.seal(kind, context, plain, nonce)

    async def _new_data_key(self) -> _Writing:
        data_key = os.urandom(KEY_SIZE)
        key_id, wrapped = await self._provider_call(self.provider.wrap_key(data_key))
        if not 1 <= len(key_id.encode()) <= 255 or len(wrapped) > 0xFFFF:
            raise EncryptionError("the key provider returned an unusable key id or wrapped key")
        names = hmac.digest(data_key, _NAMES_INFO, "sha256")
        writing = _Writing(key_id, wrapped, self._aesgcm(data_key), names)
        self._writing = writing
        return writing

    async def _open(self, kind: int, context: bytes, envelope: bytes) -> bytes:
        _check(envelope[:4] == ENVELOPE_MAGIC, "not a sealed envelope (bad magic)")
        _check(len(envelope) > 7 and envelope[4] == _VERSION, "unknown envelope version")
        _check(envelope[5] == kind, "sealed as another kind of record")
        start = 7 + envelope[6]
        _check(len(envelope) >= start + 2, "sealed record truncated")
        (size,) = _U16.unpack_from(envelope, start)
        nonce_at = start + 2 + size
        body_at = nonce_at + _NONCE
        _check(len(envelope) >= body_at + _TAG, "sealed record truncated")
        key_part = envelope[6:nonce_at]
        aead = await self._data_key(envelope[7:start], envelope[start + 2 : nonce_at], key_part)
        nonce, body = envelope[nonce_at:body_at], envelope[body_at:]
        try:
            if len(body) > _ON_LOOP:
                return await anyio.to_thread.run_sync(
                    aead.decrypt, nonce, body, envelope[:body_at] + context
                )
            return aead.decrypt(nonce, body, envelope[:body_at] + context)
        except Exception as exc:  # cryptography's InvalidTag
            raise DecryptionError("does not authenticate (changed, moved or forged)") from exc

    async def _data_key(self, name: bytes, wrapped: bytes, cache_key: bytes) -> AESGCM:
        aead = self._reading.get(cache_key)
        if aead is not None:
            return aead
        try:
            key_id = name.decode()
        except UnicodeDecodeError:
            raise DecryptionError("the key id is not UTF-8") from None
        try:
            data_key = await self._provider_call(self.provider.unwrap_key(key_id, wrapped))
        except UnknownKeyError:
            # Ours, naming the key id asked for, whatever the provider's message said.
            raise UnknownKeyError(key_id) from None
        _check(len(data_key) == KEY_SIZE, "the unwrapped data key is not 32 bytes")
        aead = self._aesgcm(data_key)
        self._reading[cache_key] = aead
        if len(self._reading) > _CACHED_KEYS:
            self._reading.popitem(last=False)
        return aead

    @staticmethod
    async def _provider_call(call: Awaitable[_T]) -> _T:
        """Await a provider's call; what it raises besides our errors is EncryptionError."""
        try:
            return await call
        except CheckpointError:
            raise
        except Exception as exc:
            raise EncryptionError(f"the key provider failed: {type(exc).__name__}") from exc


def _check(ok: bool, reason: str) -> None:
    if not ok:
        raise DecryptionError(reason)


def _context(workflow_id: str, step: int, key: str | None) -> bytes:
    """The associated data that binds a record to its workflow, step and effect key."""
    name = workflow_id.encode()
    out = _U16.pack(len(name)) + name + _U64.pack(step)
    if key is not None:
        effect = key.encode()
        out += _U16.pack(len(effect)) + effect
    return out
