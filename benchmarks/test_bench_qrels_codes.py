"""The binary-code qrels benchmark's synthetic data (``benchmarks.bench_qrels_codes``), on a tiny
size, without timings."""

from __future__ import annotations

import numpy as np

from benchmarks import bench_qrels_codes as bc


def test_codes_and_graded_qrels_follow_the_flipped_bits():
    q, c, qids, dids, qrels = bc.make_codes(2_000, 20, seed=3)
    assert set(np.unique(c).tolist()) == {-1.0, 1.0} and c.shape == (2_000, bc.BITS)
    row = {d: j for j, d in enumerate(dids)}
    rows = [row[d] for judged in qrels.values() for d in judged]
    assert len(rows) == len(set(rows)) == 20 * bc.JUDGED  # distinct rows: none overwritten
    graded = 0
    for i, qid in enumerate(qids):
        for d, grade in qrels[qid].items():
            hamming = int((q[i] != c[row[d]]).sum())
            graded += grade == bc.grade_of(hamming) and 8 <= hamming <= 30
    # all but the random codes (one in ten) sit at their flips: their grade is their distance's
    assert 0.8 * len(rows) <= graded < len(rows)
    assert bc.grade_of(13) == 3 and bc.grade_of(14) == 2 and bc.grade_of(21) == 1
    assert bc.grade_of(22) == 0
