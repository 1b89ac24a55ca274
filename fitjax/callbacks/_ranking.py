"""How `ModelCheckpoint` ranks its saves: the top k by score, per run with `Trainer(runs=...)`.

A score is a float, or a tuple of each run's when the runs of a fit log the monitored value each
under their own key. Ranked per run, a save is kept while it is among the k best of any run: the
k best of a run over the saves kept equal its k best over every save made (a save out of a run's
top k never re-enters it), so each run's best is its best of the whole fit.
"""

from __future__ import annotations

from typing import Mapping, Sequence

Score = float | tuple[float, ...]

__all__ = ["Score", "best", "in_top_k", "per_run", "top_k"]


def per_run(scored: Mapping[str, Score]) -> list[dict[str, float]]:
    """`{path: score}` as one such dict per run (one dict for plain scores)."""
    first = next(iter(scored.values()), None)
    if not isinstance(first, tuple):
        return [dict(scored)]
    return [{path: score[i] for path, score in scored.items()} for i in range(len(first))]


def best(scores: Mapping[str, float], mode: str) -> tuple[str, float]:
    """The path whose score is best, and its score."""
    path = (min if mode == "min" else max)(scores, key=scores.get)
    return path, scores[path]


def in_top_k(score: Score, kept: Sequence[Score], k: int, mode: str) -> bool:
    """Lightning's `check_monitor_top_k`: a place free among `kept`, or better than the k-th
    best (of any run's, for a tuple)."""
    if isinstance(score, tuple):
        return any(in_top_k(s, [v[i] for v in kept], k, mode) for i, s in enumerate(score))
    ranked = sorted(kept)
    if len(ranked) < k:
        return True
    kth = ranked[k - 1] if mode == "min" else ranked[-k]
    return score < kth if mode == "min" else score > kth


def top_k(scored: Mapping[str, Score], k: int, mode: str) -> set[str]:
    """The paths among the k best (of any run)."""
    return {path for run in per_run(scored)
            for path in sorted(run, key=lambda p: run[p] if mode == "min" else -run[p])[:k]}
