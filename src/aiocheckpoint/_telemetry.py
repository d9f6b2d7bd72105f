"""OpenTelemetry spans and metrics, when ``opentelemetry-api`` is installed (docs/observability.md).

Every span and metric the library reports is made here, so call sites stay one line:

* :func:`traced` decorates an async method: a span named ``aiocheckpoint.<operation>``
  around each call, attributed from the call's ``workflow_id``, ``step``, ``lease``,
  ``record``, ``owner`` and ``key`` arguments, with the error recorded if it raises, and
  the call's duration in a histogram when it is a save or a load.
* :func:`round_trip` calls a storage method inside a ``CLIENT`` span named by the database
  semantic conventions (``{db.operation.name} {db.system.name}``, e.g. ``save sqlite``),
  a child of the current span, and counts the bytes it writes.
* :func:`annotate` sets an attribute of the current span from inside a traced method;
  :func:`record_in_doubt`, :func:`record_commit` and :func:`record_sweep_deletions` count
  events and sizes where they happen (an effect replayed, a group commit, a sweep).

The counters are summed here and handed to the SDK when it collects (observable counters):
an SDK counter's ``add`` costs as much as a histogram point, a sum in a dict a tenth of it.

Without the package, :data:`ENABLED` is False, :func:`traced` returns the method itself and
:func:`round_trip` only calls it: nothing is imported and nothing is measured. With the
package but no SDK configured (no tracer or meter provider set), each call costs one check
of two globals before the method runs as it would without telemetry. A meter provider alone
gives the metrics without starting a span; a span sampled out is not made current, and its
storage round trips make no span.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from typing_extensions import ParamSpec

from .errors import LeaseLostError

__all__ = [
    "ENABLED",
    "SCOPE",
    "annotate",
    "record_commit",
    "record_in_doubt",
    "record_sweep_deletions",
    "round_trip",
    "traced",
]

P = ParamSpec("P")
T = TypeVar("T")
Method = Callable[P, Coroutine[Any, Any, T]]
Attributes = dict[str, "str | int | bool"]

#: The instrumentation scope: the name of the library's tracer and meter.
SCOPE = "aiocheckpoint"

try:
    from opentelemetry import context as _context
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
except ImportError:  # the [otel] extra is not installed: every helper below is a no-op
    ENABLED = False
else:
    ENABLED = True


def traced(
    operation: str,
    *,
    duration: str | None = None,
    acquires: bool = False,
    instance: bool = False,
    private: Callable[[Any], bool] | None = None,
) -> Callable[[Method[P, T]], Method[P, T]]:
    """Decorate an async method with a span ``aiocheckpoint.<operation>``.

    ``duration`` ("save" or "load") names the latency histogram the call is timed in;
    ``acquires`` counts a result that is not None as a lease acquisition; ``instance``
    takes the workflow id and step from the method's object too. ``private``, asked with
    the method's object, says whether the messages of the errors it raises may hold what
    the store keeps encrypted: then the span records the error's type, not its message.
    Without OpenTelemetry the method is returned as it is.
    """
    if not ENABLED:
        return _identity
    described = _Operation(operation, duration, acquires, instance, private)
    return functools.partial(_wrap, described)


def round_trip(
    method: Callable[P, Coroutine[Any, Any, T]], /, *args: P.args, **kwargs: P.kwargs
) -> Coroutine[Any, Any, T]:
    """``method(*args, **kwargs)`` (a bound storage method) in a ``CLIENT`` span when enabled.

    The storage's ``db_system`` attribute names the system (``sqlite``, ``postgresql``...);
    ``bytes`` arguments count as bytes written and a ``SplitResult``'s blobs as its batch.
    Await it where it is called: its span (if any) starts with the call.
    """
    live = _live() if ENABLED else None
    if live is None:
        return method(*args, **kwargs)
    return live.round_trip(method, args, kwargs)


def quiet() -> bool:
    """Whether no telemetry is recorded now: :func:`round_trip` would call its method as is."""
    return not ENABLED or _live() is None


def annotate(key: str, value: str | int | bool) -> None:
    """Set an attribute on the current span (the traced call this runs in), when enabled."""
    if ENABLED and _live() is not None:
        _trace.get_current_span().set_attribute(key, value)


def record_in_doubt(workflow_id: str, step: int, key: str) -> None:
    """Count an effect found in doubt (an intent without an outcome) on replay."""
    live = _live() if ENABLED else None
    if live is not None:
        live.in_doubt(workflow_id, step, key)


def record_commit(system: str, writes: int) -> None:
    """Record the size of one group commit: ``writes`` saves in one transaction."""
    live = _live() if ENABLED else None
    if live is not None:
        live.instruments.commit_size.record(writes, {"db.system.name": system})


def record_sweep_deletions(kind: str, count: int, reason: str | None = None) -> None:
    """Count ``count`` things of ``kind`` ("workflow", "checkpoint", "blob") a sweep deleted.

    ``reason`` says why a workflow went (its TTL: "finished", "failed", "idle").
    """
    live = _live() if ENABLED else None
    if live is not None and count:
        attributes: Attributes = {"aiocheckpoint.sweep.kind": kind}
        if reason is not None:
            attributes["aiocheckpoint.sweep.reason"] = reason
        live.instruments.sweep_deletions.add(count, attributes)


def _identity(fn: Method[P, T]) -> Method[P, T]:
    return fn


class _Operation:
    """What :func:`traced` knows of one decorated method."""

    __slots__ = ("acquires", "duration", "instance", "name", "params", "private", "span_name")

    def __init__(
        self,
        name: str,
        duration: str | None,
        acquires: bool,
        instance: bool,
        private: Callable[[Any], bool] | None,
    ) -> None:
        self.name = name
        self.span_name = f"{SCOPE}.{name}"
        self.duration = None if duration is None else f"{duration}_duration"
        self.acquires = acquires
        self.instance = instance
        self.private = private
        self.params: tuple[tuple[int, str], ...] = ()

    def hides_messages(self, args: tuple[Any, ...]) -> bool:
        """Whether this call's errors go on its span by type alone (see :func:`traced`)."""
        return self.private is not None and bool(args) and self.private(args[0])

    def attributes(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Attributes:
        """The span's attributes, from the call's arguments (unvalidated: types checked)."""
        attributes: Attributes = {}
        if self.instance and args:
            _from_object(args[0], attributes)
        for index, name in self.params:
            value = args[index] if index < len(args) else kwargs.get(name)
            if value is not None:
                _ARGUMENTS[name](value, attributes)
        return attributes


def _wrap(operation: _Operation, fn: Method[P, T]) -> Method[P, T]:
    names = list(inspect.signature(fn).parameters)
    operation.params = tuple((i, n) for i, n in enumerate(names) if n in _ARGUMENTS)

    # A plain function returning the coroutine: no frame of its own while no SDK is set.
    @functools.wraps(fn)
    def traced_method(*args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, T]:
        live = _live()
        if live is None:
            return fn(*args, **kwargs)  # no SDK configured: the method as it is
        return live.run(operation, fn, args, kwargs)

    return _coroutine_function(traced_method)


def _coroutine_function(fn: Method[P, T]) -> Method[P, T]:
    """Mark ``fn`` (which returns a coroutine) as a coroutine function for introspection."""
    mark = getattr(inspect, "markcoroutinefunction", None)  # Python 3.12+
    if mark is not None:
        return mark(fn)  # type: ignore[no-any-return]
    fn._is_coroutine = asyncio.coroutines._is_coroutine  # type: ignore[attr-defined]
    return fn


def _text(key: str) -> Callable[[Any, Attributes], None]:
    def put(value: Any, attributes: Attributes) -> None:
        if type(value) is str:
            attributes[key] = value

    return put


def _number(key: str) -> Callable[[Any, Attributes], None]:
    def put(value: Any, attributes: Attributes) -> None:
        if type(value) is int:
            attributes[key] = value

    return put


def _from_object(value: Any, attributes: Attributes) -> None:
    """A lease's or an effect record's (or a workflow's) workflow id, step, key, owner."""
    for name in ("workflow_id", "step", "key", "owner", "token"):
        found = getattr(value, name, None)
        if found is not None and name in _ARGUMENTS:
            _ARGUMENTS[name](found, attributes)


_ARGUMENTS: dict[str, Callable[[Any, Attributes], None]] = {
    "workflow_id": _text("aiocheckpoint.workflow.id"),
    "step": _number("aiocheckpoint.step"),
    "key": _text("aiocheckpoint.effect.key"),
    "owner": _text("aiocheckpoint.lease.owner"),
    "token": _number("aiocheckpoint.lease.token"),
    "lease": _from_object,
    "record": _from_object,
}


def _system(storage: object) -> str:
    system = getattr(storage, "db_system", None)
    return system if isinstance(system, str) else "other"


#: The storage calls that write: their ``bytes`` arguments count as bytes written.
_WRITES = frozenset({"save", "save_tree", "put_effect"})


def _measure(args: tuple[Any, ...]) -> tuple[int, int]:
    """Bytes written and records in the batch of a storage call's arguments."""
    size, batch = 0, 0
    for value in args:
        if isinstance(value, bytes):
            size, batch = size + len(value), batch + 1
        elif not isinstance(value, (str, int)):
            blobs = getattr(value, "blobs", None)
            if isinstance(blobs, dict):  # a SplitResult: its new blobs go in the same write
                counted = getattr(value, "stored_bytes", None)  # not a walk over every blob
                size += counted() if callable(counted) else sum(map(len, blobs.values()))
                batch += len(blobs)
    return size, batch


if ENABLED:
    from opentelemetry.trace import SpanKind, Status, StatusCode

    try:  # read directly: get_*_provider() costs microseconds (it looks up the environment)
        _TRACE_GLOBALS: Any = _trace
        _METRIC_GLOBALS: Any = __import__(
            "opentelemetry.metrics._internal", fromlist=["_METER_PROVIDER"]
        )
        _TRACE_GLOBALS._TRACER_PROVIDER  # noqa: B018
        _METRIC_GLOBALS._METER_PROVIDER  # noqa: B018
    except (ImportError, AttributeError):  # another API version: ask it (correct, slower)
        _TRACE_GLOBALS = _METRIC_GLOBALS = None

    # Providers named by environment variables are made on first ask: ask once, now.
    _trace.get_tracer_provider()
    _metrics.get_meter_provider()

    #: Each instrument: its attribute on _Instruments, histogram or counter, name, unit, what.
    _INSTRUMENTS = (
        ("save_duration", True, "aiocheckpoint.checkpoint.save.duration", "s",
         "Time to store a checkpoint (create_checkpoint), until durable."),
        ("load_duration", True, "aiocheckpoint.checkpoint.load.duration", "s",
         "Time to read and verify a checkpoint or a resume point."),
        ("bytes_written", False, "aiocheckpoint.storage.bytes_written", "By",
         "Bytes of records, blobs and effect records handed to the storage to write."),
        ("commit_size", True, "aiocheckpoint.storage.commit.size", "{write}",
         "Writes committed together by one group commit (one transaction)."),
        ("lease_acquisitions", False, "aiocheckpoint.lease.acquisitions", "{lease}",
         "Leases granted (acquire_lease, claim_workflow)."),
        ("lease_losses", False, "aiocheckpoint.lease.losses", "{lease}",
         "Operations refused because their lease was lost."),
        ("in_doubt", False, "aiocheckpoint.effect.in_doubt", "{effect}",
         "Effects found in doubt (an intent without an outcome) on replay."),
        ("sweep_deletions", False, "aiocheckpoint.sweep.deletions", "{item}",
         "Workflows, checkpoints and blobs deleted by retention sweeps."),
    )  # fmt: skip

    class _Tally:
        """A counter kept here and read by the SDK when it collects (an observable counter).

        A synchronous counter's ``add`` costs the SDK several microseconds (its attributes
        cleaned, hashed and sorted, an aggregation under a lock); a sum in a dict costs a
        tenth of that, and the exporter sees the same monotonic sums.
        """

        def __init__(self) -> None:
            self._lock = threading.Lock()  # adds may come from several loops' threads
            self._sums: dict[frozenset[tuple[str, Any]], list[Any]] = {}

        def add(self, amount: int, attributes: Attributes | None = None) -> None:
            """Add ``amount`` to the sum of ``attributes``."""
            key = frozenset(attributes.items()) if attributes else frozenset()
            with self._lock:
                found = self._sums.get(key)
                if found is None:
                    self._sums[key] = [amount, dict(attributes or {})]
                else:
                    found[0] += amount

        def observe(self, options: _metrics.CallbackOptions) -> list[_metrics.Observation]:
            """Every sum so far, with its attributes (the SDK's callback)."""
            with self._lock:
                return [_metrics.Observation(total, dict(a)) for total, a in self._sums.values()]

    class _Instruments:
        """The library's metric instruments, made from one meter (see _INSTRUMENTS)."""

        save_duration: _metrics.Histogram
        load_duration: _metrics.Histogram
        bytes_written: _Tally
        commit_size: _metrics.Histogram
        lease_acquisitions: _Tally
        lease_losses: _Tally
        in_doubt: _Tally
        sweep_deletions: _Tally

        def __init__(self, meter: _metrics.Meter) -> None:
            for attribute, histogram, name, unit, description in _INSTRUMENTS:
                if histogram:
                    made: Any = meter.create_histogram(name, unit=unit, description=description)
                else:
                    made = _Tally()
                    meter.create_observable_counter(
                        name, [made.observe], unit=unit, description=description
                    )
                setattr(self, attribute, made)

    #: The metric attributes of each (operation or storage call, system): built once, shared.
    _MEASURED: dict[tuple[str, str, str], Attributes] = {}

    def _measured(key: str, name: str, system: str) -> Attributes:
        found = _MEASURED.get((key, name, system))
        if found is None:
            found = _MEASURED[key, name, system] = {key: name, "db.system.name": system}
        return found

    class _Live:
        """The tracer and instruments of the providers configured now."""

        def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
            self.providers = (tracer_provider, meter_provider)
            version = _version()
            #: False with a meter provider only: metrics, and no span is even started.
            self.tracing = tracer_provider is not None
            self.tracer = (
                _trace.NoOpTracer()
                if tracer_provider is None
                else tracer_provider.get_tracer(SCOPE, version)
            )
            meter = (
                _metrics.NoOpMeter(SCOPE)
                if meter_provider is None
                else meter_provider.get_meter(SCOPE, version)
            )
            self.instruments = _Instruments(meter)

        async def run(
            self,
            operation: _Operation,
            fn: Callable[..., Coroutine[Any, Any, T]],
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
        ) -> T:
            """Call ``fn`` in the operation's span; time it, count what it says."""
            system = _system(getattr(args[0], "storage", None)) if args else "other"
            measured = _measured("aiocheckpoint.operation", operation.name, system)
            duration = operation.duration
            histogram = None if duration is None else getattr(self.instruments, duration)
            span = None
            if self.tracing:
                attributes = operation.attributes(args, kwargs)
                span = self.tracer.start_span(operation.span_name, attributes=attributes)
            private = span is not None and operation.hides_messages(args)
            result = await self._call(span, fn, args, kwargs, measured, histogram, private)
            if operation.acquires and result is not None:
                self.instruments.lease_acquisitions.add(1, measured)
            return result

        async def _call(
            self,
            span: _trace.Span | None,
            fn: Callable[..., Coroutine[Any, Any, T]],
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            measured: Attributes,
            histogram: Any,
            private: bool = False,
        ) -> T:
            """Await ``fn(*args, **kwargs)`` with ``span`` current; end it, time the call.

            ``private``: an error goes on the span by its type alone.
            """
            # A span sampled out is not made current: its round trips then make no span either.
            token = None
            if span is not None and span.is_recording():
                token = _context.attach(_trace.set_span_in_context(span))
            start = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                measured = self._failed(span, exc, measured, private)
                raise
            finally:
                elapsed = time.perf_counter() - start
                if token is not None:
                    _context.detach(token)
                if span is not None:
                    span.end()
                if histogram is not None:
                    histogram.record(elapsed, measured)

        def _failed(
            self, span: _trace.Span | None, exc: Exception, measured: Attributes, private: bool
        ) -> Attributes:
            """Record ``exc`` on the span; the metric attributes of the failed call."""
            error = type(exc).__qualname__
            if span is not None:
                span.set_attribute("error.type", error)
                if private:  # the exception event without its message and traceback
                    span.add_event("exception", {"exception.type": error})
                    span.set_status(Status(StatusCode.ERROR, error))
                else:
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, f"{error}: {exc}"[:1000]))
            failed = {**measured, "error.type": error}
            # Counted once, by the library's operation (its storage round trip fails too).
            if isinstance(exc, LeaseLostError) and "aiocheckpoint.operation" in measured:
                self.instruments.lease_losses.add(1, failed)
            return failed

        def round_trip(
            self,
            method: Callable[..., Coroutine[Any, Any, T]],
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
        ) -> Coroutine[Any, Any, T]:
            """The storage call in a ``CLIENT`` span (under a recording one); its bytes.

            Not a coroutine itself (the call sites await it at once): untraced, the storage's
            own coroutine is returned, with no frame of ours around it.
            """
            system = _system(getattr(method, "__self__", None))
            operation = method.__name__
            measured = _measured("db.operation.name", operation, system)
            size, batch = _measure(args) if operation in _WRITES else (0, 0)
            if size:
                self.instruments.bytes_written.add(size, measured)
            if not self.tracing or not _trace.get_current_span().is_recording():
                return method(*args, **kwargs)  # not traced (or sampled out): no span
            attributes = dict(measured)
            if batch > 1:  # the conventions set a batch size only for batches of two or more
                attributes["db.operation.batch.size"] = batch
            if size:
                attributes["aiocheckpoint.write.size"] = size
            span = self.tracer.start_span(
                f"{operation} {system}", kind=SpanKind.CLIENT, attributes=attributes
            )
            return self._call(span, method, args, kwargs, measured, None)

        def in_doubt(self, workflow_id: str, step: int, key: str) -> None:
            self.instruments.in_doubt.add(1)
            _trace.get_current_span().add_event(
                "aiocheckpoint.effect.in_doubt",
                {
                    "aiocheckpoint.workflow.id": workflow_id,
                    "aiocheckpoint.step": step,
                    "aiocheckpoint.effect.key": key,
                },
            )

    _CURRENT: list[_Live] = []

    def _live() -> _Live | None:
        """The live telemetry, or None while no tracer or meter provider is configured."""
        if _TRACE_GLOBALS is None:
            return _rebuilt((_trace.get_tracer_provider(), _metrics.get_meter_provider()))
        tracer_provider = _TRACE_GLOBALS._TRACER_PROVIDER
        meter_provider = _METRIC_GLOBALS._METER_PROVIDER
        if tracer_provider is None and meter_provider is None:
            return None  # the API's no-op default: the one check on the hot path
        for current in _CURRENT:
            if current.providers == (tracer_provider, meter_provider):
                return current
        return _rebuilt((tracer_provider, meter_provider))

    def _rebuilt(providers: tuple[Any, Any]) -> _Live:
        """The telemetry of ``providers``: made anew when one was set (or a test replaced it)."""
        if not _CURRENT or _CURRENT[0].providers != providers:
            _CURRENT[:] = [_Live(*providers)]
        return _CURRENT[0]

    def _version() -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("aiocheckpoint")
        except PackageNotFoundError:
            return "0"
