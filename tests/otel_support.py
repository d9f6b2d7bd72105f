"""The OpenTelemetry SDK with in-memory exporters, installed as the global providers for a test.

The API lets a process set its providers once; like opentelemetry-python's own test helpers,
:func:`installed` resets the API's globals before and after, so each test sees only its
own spans and metrics and the tests that run after it see no SDK at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.util._once import Once


@dataclass
class Telemetry:
    """What a test reads back: the finished spans and the metrics."""

    spans: InMemorySpanExporter
    reader: InMemoryMetricReader

    def finished(self) -> list[ReadableSpan]:
        """Every span ended so far, in the order they ended."""
        return list(self.spans.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        """The finished spans called ``name``."""
        return [span for span in self.finished() if span.name == name]

    def points(self, metric: str) -> list[Any]:
        """The data points of ``metric`` (empty when it was never recorded)."""
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for item in scope.metrics:
                    if item.name == metric:
                        found.extend(item.data.data_points)
        return found

    def total(self, metric: str, **attributes: Any) -> float:
        """The sum of a counter's points (a histogram's count) whose attributes match."""
        total = 0.0
        for point in self.points(metric):
            if all(point.attributes.get(k) == v for k, v in attributes.items()):
                total += getattr(point, "count", None) or getattr(point, "value", 0)
        return total


def _reset() -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None


@contextmanager
def installed(sampler: Sampler | None = None, *, tracing: bool = True) -> Iterator[Telemetry]:
    """The SDK as the global tracer (unless not ``tracing``) and meter providers, in memory."""
    _reset()
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider(sampler=sampler)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    if tracing:
        trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    try:
        yield Telemetry(exporter, reader)
    finally:
        _reset()
