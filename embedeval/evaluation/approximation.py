"""How a result says it came from an approximate search: the lines that mark it (kNN recall on
the exactly searched sample and each metric's approximate-minus-exact difference with its
interval) and the warning when a metric moved beyond sampling noise."""

from __future__ import annotations

from typing import Any

__all__ = ["approximation_lines", "warn_if_biased"]


def approximation_lines(approx: dict[str, Any]) -> list[str]:
    """The lines that mark a result as approximate: index, kNN recall and, per metric, the
    approximate-minus-exact difference on the exact sample with its interval."""
    if not approx:
        return []
    recall = approx.get("knn_recall")
    recall_text = "n/a" if recall is None else f"{recall:.4f}"
    lines = [
        f"APPROXIMATE search ({approx.get('index', '?')}): kNN recall {recall_text} on "
        f"{approx.get('n_sample', 0)} queries searched exactly too; approximate - exact:"
    ]
    level = approx.get("ci", 0.95)
    for name, entry in approx.get("metrics", {}).items():
        diff, ci = entry.get("difference"), entry.get("difference_ci")
        if diff is None:
            continue
        band = f" [{ci[0]:+.4f}, {ci[1]:+.4f}] ({level * 100:g}% CI)" if ci else ""
        lines.append(f"  {name}: {diff:+.4f}{band}{'  BIASED' if _excludes_zero(ci) else ''}")
    return lines


def _excludes_zero(ci: Any) -> bool:
    return bool(ci) and (ci[0] > 0 or ci[1] < 0)


def warn_if_biased(approx: dict[str, Any], stacklevel: int = 3) -> None:
    """Warn when an approximate search moved a metric by more than its sampling noise
    (``stacklevel`` as in :func:`warnings.warn`: the frame the warning points at)."""
    import warnings

    from ..utils.errors import EmbedevalWarning

    biased = [
        f"{name} {e['difference']:+.4f} [{e['difference_ci'][0]:+.4f}, "
        f"{e['difference_ci'][1]:+.4f}]"
        for name, e in approx.get("metrics", {}).items()
        if _excludes_zero(e.get("difference_ci"))
    ]
    if biased:
        recall = approx.get("knn_recall")
        warnings.warn(
            f"the approximate index ({approx.get('index', '?')}, kNN recall "
            f"{'n/a' if recall is None else f'{recall:.3f}'}) changes the metrics beyond "
            f"sampling noise (approximate - exact, with interval): {'; '.join(biased)}. "
            "Use exact search (index=None) for numbers to publish, or search the index deeper.",
            EmbedevalWarning,
            stacklevel=stacklevel,
        )
