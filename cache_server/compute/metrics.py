"""Prometheus counters, one registry per server so that tests and processes never share state."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest


class Metrics:
    """The server's counters and histograms, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.prompts_computed = Counter(
            "cache_server_prompts_computed",
            "Target forward computations, counted per prompt (a recompute for missing layers counts again).",
            registry=self.registry,
        )
        self.prompts_failed = Counter(
            "cache_server_prompts_failed", "Prompts whose computation failed.", registry=self.registry
        )
        self.hidden_requests = Counter(
            "cache_server_hidden_requests", "GET /hidden requests answered with data.", registry=self.registry
        )
        self.hidden_bytes = Counter(
            "cache_server_hidden_bytes", "Bytes of GET /hidden bodies sent.", registry=self.registry
        )
        self.compute_seconds = Histogram(
            "cache_server_compute_seconds",
            "Wall time of one batched target forward (generation excluded).",
            registry=self.registry,
        )

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
