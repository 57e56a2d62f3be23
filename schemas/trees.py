"""EAGLE's dynamic-tree options, as jobs, reports and the command line name them ("TOPK,DEPTH,TOTAL")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class EagleTreeShape:
    """EAGLE's `top_k`, `depth` and `total_token` (nodes, root included)."""

    top_k: int
    depth: int
    total_tokens: int

    @property
    def key(self) -> str:
        """How reports name it: "TOPK,DEPTH,TOTAL"."""
        return f"{self.top_k},{self.depth},{self.total_tokens}"

    @classmethod
    def parse(cls, text: str) -> EagleTreeShape:
        """ "10,7,60" -> the shape; refuses shapes EAGLE's selection cannot fill."""
        parts = text.split(",")
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"an EAGLE tree is TOPK,DEPTH,TOTAL (three positive integers), got {text!r}")
        shape = cls(*(int(p) for p in parts))
        shape.check()
        return shape

    def check(self) -> None:
        """Raise ValueError unless every number is in range for `topK_genrate`."""
        k, d, total = self.top_k, self.depth, self.total_tokens
        candidates = k + d * k * k
        if k < 1 or d < 0 or total < 2 or total - 1 > candidates:
            raise ValueError(
                f"EAGLE tree {self.key}: need top_k >= 1, depth >= 0 and 2 <= total_tokens <= 1 + "
                f"top_k + depth * top_k^2 (= {1 + candidates}, the candidates drafted)"
            )
