"""Tests of `cache_server.generation`."""
