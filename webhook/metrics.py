"""The webhook's Prometheus metrics, in a registry of its own per app (no process globals)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from webhook.modelcache import ModelSource

#: Admission runs in tens of microseconds; the apiserver gives up after timeoutSeconds (5s).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True, slots=True)
class WebhookMetrics:
    registry: CollectorRegistry
    admission_duration: Histogram
    decisions: Counter
    certificate_expiry: Gauge

    @classmethod
    def create(cls, models: ModelSource) -> WebhookMetrics:
        registry = CollectorRegistry()
        metrics = cls(
            registry=registry,
            admission_duration=Histogram(
                "gpuplace_webhook_admission_duration_seconds",
                "Time to answer one AdmissionReview, from body read to answer built.",
                ["operation"],
                buckets=LATENCY_BUCKETS,
                registry=registry,
            ),
            decisions=Counter(
                "gpuplace_webhook_decisions",
                "AdmissionReviews answered, by operation and result "
                "(allowed, patched, denied, malformed).",
                ["operation", "result"],
                registry=registry,
            ),
            certificate_expiry=Gauge(
                "gpuplace_webhook_certificate_expiry_timestamp_seconds",
                "When the serving certificate expires (Unix time).",
                registry=registry,
            ),
        )
        Gauge(
            "gpuplace_webhook_model_generation",
            "Generation of the model the webhook admits against.",
            registry=registry,
        ).set_function(lambda: models.current().generation)
        Gauge(
            "gpuplace_webhook_model_maps",
            "Placement maps in the model the webhook admits against.",
            registry=registry,
        ).set_function(lambda: len(models.current().maps))
        Gauge(
            "gpuplace_webhook_model_loaded",
            "1 once the model cache has loaded the model (readiness).",
            registry=registry,
        ).set_function(lambda: 1.0 if models.loaded() else 0.0)
        return metrics
