"""One measurement of bench_symmetric.py, run in its own process: prints one JSON line."""

from __future__ import annotations

import json
import resource
import sys
import time

from benchmarks._common import Timer, make_data, peak_rss_mb
from benchmarks._core_child import METRICS


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(method: str, case: str) -> None:
    x, y = make_data(case)
    values: dict[str, float] = {}
    cpu0 = cpu_seconds()
    if method in ("loo", "split", "one_sided"):
        import embedeval as ee

        kw = dict(metrics=METRICS[case], k=None, progress=False)
        if method == "split":
            # The same amount of work without symmetry: the reference is a copy of the queries.
            with Timer() as t:
                res = ee.evaluate(x, y, x.copy(), y, **kw)
        elif method == "one_sided":
            # Leave-one-out through the one-sided engine (each product computed twice): the
            # queries are the first rows of an explicit reference, each excluded by identity.
            with Timer() as t:
                res = ee.evaluate(x, y, x.copy(), y, ref_includes_query=True, **kw)
        else:
            with Timer() as t:
                res = ee.evaluate(x, y, **kw)
        values = dict(res.metrics)
    elif method == "faiss":
        import faiss
        import numpy as np

        k = int(np.bincount(y).max()) + 1  # max R + 1: the depth MAP@R needs, self included
        with Timer() as t:
            index = faiss.IndexFlatL2(x.shape[1])
            index.add(x)
            index.search(x, min(k, 2048))
    else:
        raise ValueError(method)
    print(
        json.dumps(
            {
                "seconds": t.seconds,
                "cpu_seconds": cpu_seconds() - cpu0,
                "peak_mb": peak_rss_mb(),
                "values": values,
                "at": time.time(),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
