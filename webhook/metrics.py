"""The webhook's Prometheus metrics, in a registry of its own per app (no process globals).

With several server processes (`multiprocess_dir`), counters, histograms and gauges are written
to files that `prometheus_client` shares between them, and the registry serves the totals over
every process that answered since the parent started; the model gauges are the answering
process's own view.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from webhook.modelcache import ModelSource

#: Admission runs in tens of microseconds; the apiserver gives up after timeoutSeconds (5s).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True, slots=True)
class WebhookMetrics:
    registry: CollectorRegistry
    admission_duration: Histogram
    decisions: Counter
    certificate_expiry: Gauge
    #: Reviews this process answered: with several processes, one series a pid (the balance).
    process_reviews: Gauge
    #: What the server refused or cut off, by `kubeio.bounds.Refusal` or
    #: `webhook.fairqueue.QueueRefusal`.
    refused: Counter
    #: Open connections and buffered request bytes, set once a second by the server.
    connections: Gauge
    buffered_bytes: Gauge

    @classmethod
    def create(cls, models: ModelSource, multiprocess_dir: str | None = None) -> WebhookMetrics:
        registry = CollectorRegistry()
        # With several processes the metric objects only write their files; the registry reads
        # every process's files, and registering the objects too would count this one twice.
        own: CollectorRegistry | None = registry
        if multiprocess_dir is not None:
            MultiProcessCollector(registry, path=multiprocess_dir)  # type: ignore[no-untyped-call]
            own = None
        metrics = cls(
            registry=registry,
            admission_duration=Histogram(
                "gpuplace_webhook_admission_duration_seconds",
                "Time to answer one AdmissionReview, from body read to answer built.",
                ["operation"],
                buckets=LATENCY_BUCKETS,
                registry=own,
            ),
            decisions=Counter(
                "gpuplace_webhook_decisions",
                "AdmissionReviews answered, by operation and result "
                "(allowed, patched, denied, malformed).",
                ["operation", "result"],
                registry=own,
            ),
            # The earliest expiry any running process serves: the one to alert on mid-rotation.
            certificate_expiry=Gauge(
                "gpuplace_webhook_certificate_expiry_timestamp_seconds",
                "When the serving certificate expires (Unix time).",
                registry=own,
                multiprocess_mode="livemin",
            ),
            process_reviews=Gauge(
                "gpuplace_webhook_process_reviews",
                "AdmissionReviews answered by this server process since it started "
                "(label pid with several processes).",
                registry=own,
                multiprocess_mode="liveall",
            ),
            refused=Counter(
                "gpuplace_webhook_refused",
                "Connections and requests the server refused or closed to stay within its bounds, "
                "by reason (connections, evicted, buffer, handshake_timeout, head_timeout, "
                "body_timeout, write_timeout, head_too_large, body, malformed, "
                "validation_namespace, validation_queue).",
                ["reason"],
                registry=own,
            ),
            connections=Gauge(
                "gpuplace_webhook_open_connections",
                "Open connections (summed over server processes).",
                registry=own,
                multiprocess_mode="livesum",
            ),
            buffered_bytes=Gauge(
                "gpuplace_webhook_buffered_request_bytes",
                "Request bytes buffered, all connections together (summed over server processes).",
                registry=own,
                multiprocess_mode="livesum",
            ),
        )
        registry.register(_ModelCollector(models))
        return metrics


class _ModelCollector(Collector):
    """The model gauges, read when scraped (not stored: a multiprocess gauge would be a file)."""

    def __init__(self, models: ModelSource) -> None:
        self._models = models

    def collect(self) -> Iterator[GaugeMetricFamily]:
        model = self._models.current()
        yield GaugeMetricFamily(
            "gpuplace_webhook_model_generation",
            "Generation of the model the webhook admits against.",
            value=model.generation,
        )
        yield GaugeMetricFamily(
            "gpuplace_webhook_model_maps",
            "Placement maps in the model the webhook admits against.",
            value=len(model.maps),
        )
        yield GaugeMetricFamily(
            "gpuplace_webhook_model_loaded",
            "1 once the model cache has loaded the model (readiness).",
            value=1.0 if self._models.loaded() else 0.0,
        )
