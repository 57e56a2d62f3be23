"""Prometheus counters, one registry per server so that tests and processes never share state."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cache_server.store.ram_cache import RamCache
from cache_server.store.usage import StoredBytesScan


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
        self.generator_errors = Counter(
            "cache_server_generator_errors",
            "Generation requests the serving engine did not answer (unreachable or 5xx), each retried.",
            registry=self.registry,
        )
        self.stored_data_corrupt = Counter(
            "cache_server_stored_data_corrupt",
            "Reads that found stored bytes failing their checksums (answered 503, the layers captured again).",
            registry=self.registry,
        )
        self.compute_seconds = Histogram(
            "cache_server_compute_seconds",
            "Wall time of one batched target forward (generation excluded).",
            registry=self.registry,
        )

    def watch_ram_cache(self, cache: RamCache) -> None:
        """Report the RAM cache's size and hits with every scrape."""
        self.registry.register(_RamCacheCollector(cache))

    def name_instance(self, instance: str) -> None:
        """`cache_server_instance_info{instance="..."} 1`: which of the servers on a store this is."""
        Info("cache_server_instance", "The server instance.", registry=self.registry).info({"instance": instance})

    def watch_stored_bytes(self, scan: StoredBytesScan) -> None:
        """Report the store's bytes per namespace and layer (its last background scan) with every scrape."""
        self.registry.register(_StoredBytesCollector(scan))

    def watch_pending(self, count: Callable[[], int]) -> None:
        """Report the prompts still waiting for the target with every scrape."""
        self.registry.register(_PendingCollector(count))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _RamCacheCollector(Collector):
    def __init__(self, cache: RamCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        c = self.cache
        yield GaugeMetricFamily("cache_server_ram_cache_bytes", "Bytes of decoded layers held in RAM.", value=c.nbytes)
        yield GaugeMetricFamily("cache_server_ram_cache_layers", "Decoded layers held in RAM.", value=len(c))
        yield GaugeMetricFamily(
            "cache_server_ram_cache_capacity_bytes", "The RAM cache's bound (--ram-cache-gb).", value=c.capacity_bytes
        )
        yield CounterMetricFamily("cache_server_ram_cache_hits", "Layers served from RAM.", value=c.hits)
        yield CounterMetricFamily("cache_server_ram_cache_misses", "Layers decoded from the store.", value=c.misses)


class _PendingCollector(Collector):
    def __init__(self, count: Callable[[], int]) -> None:
        self.count = count

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "cache_server_prompts_pending",
            "Registered prompts not computed yet (neither ready nor failed).",
            value=self.count(),
        )


class _StoredBytesCollector(Collector):
    def __init__(self, scan: StoredBytesScan) -> None:
        self.scan = scan

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "cache_server_stored_bytes",
            "Bytes stored per store namespace (a target's fingerprint) and layer ('none': token ids and "
            "manifests), as of the last background scan (--stored-bytes-refresh-s).",
            labels=["namespace", "layer"],
        )
        for (namespace, layer), n in sorted((self.scan.latest() or {}).items()):
            family.add_metric([namespace, layer], n)
        yield family
