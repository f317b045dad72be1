"""The float64 decision: near-ties the float32 keys cannot order, exact ties they split, and
identical rows, against brute forces written here (float64 distances of the float32 inputs,
a stable sort by reference index), in every backend."""

from __future__ import annotations

import numpy as np
import pytest

import embedeval as ee
from embedeval.engine.candidates import Candidates, sortable_bits
from embedeval.engine.decide import decide, gamma, key_bounds, rounding_of

METRICS = ["precision_at_1", "map_at_r"]


def brute_order(q, b):
    """Reference order of each query: float64 squared distances, ties by index."""
    b = b.astype(np.float64)
    return [np.argsort(((b - v) ** 2).sum(axis=1), kind="stable") for v in q.astype(np.float64)]


def brute_metrics(xq, yq, xb, yb):
    p1, map_r = [], []
    for i, order in enumerate(brute_order(xq, xb)):
        rel = yb[order] == yq[i]
        r = int(rel.sum())
        p1.append(float(rel[0]))
        hits = np.flatnonzero(rel[:r])
        map_r.append(float(sum((j + 1) / (h + 1) for j, h in enumerate(hits)) / r))
    return {"precision_at_1": np.array(p1), "map_at_r": np.array(map_r)}


def near_ties(n_ref, n_query, seed):
    """Rows around (1000, 0, 0, 0) a few float32 ulps apart, plus one row at (-1000, ...), so
    that no column can be translated: float32 keys ||x||^2 - 2 q.x (about 1e6, resolution
    0.06) cannot order squared distances that differ by 1e-8; float64 can."""
    rng = np.random.default_rng(seed)
    ulp = np.float32(2.0**-14)  # the float32 spacing at 1000

    def rows(n):
        x = np.empty((n, 4), dtype=np.float32)
        x[:, 0] = np.float32(1000) + rng.integers(-40, 40, n).astype(np.float32) * ulp
        x[:, 1:] = (rng.integers(-40, 40, (n, 3)) * ulp).astype(np.float32)
        return x

    xb, xq = rows(n_ref), rows(n_query)
    xb[0] = (-1000, 0, 0, 0)
    return xq, rng.integers(0, 5, n_query), xb, rng.integers(0, 5, n_ref)


def integer_ties(n_ref, n_query, seed):
    """Integer rows up to +-3000 in 8 dimensions (float64 distances exact, float32 products
    rounded: squared norms reach 7e7 > 2**24), each query with references placed
    symmetrically around it (exact ties) and duplicated references."""
    rng = np.random.default_rng(seed)
    xq = rng.integers(-3000, 3000, (n_query, 8)).astype(np.float32)
    offsets = rng.integers(-3, 4, (n_ref // 2, 8))
    centre = xq[rng.integers(0, n_query, n_ref // 2)]
    xb = np.concatenate((centre + offsets, centre - offsets)).astype(np.float32)
    xb[rng.permutation(n_ref)[:40]] = xb[:40]  # identical rows
    return xq, rng.integers(0, 6, n_query), xb, rng.integers(0, 6, n_ref)


def bf16_collisions(n_ref, n_query, seed):
    """Unit-scale rows in pairs that are equal after a bfloat16 cast (8-bit mantissa) but not
    in float32: the second row moves one coordinate by a few float32 ulps, below bfloat16's
    resolution; the pair's labels differ, so the bfloat16 product cannot order what decides a
    value, and the float64 decision must."""
    rng = np.random.default_rng(seed)
    half = rng.standard_normal((n_ref // 2, 16)).astype(np.float32)
    twin = half.copy()
    twin[:, 0] = np.nextafter(np.nextafter(half[:, 0], np.float32(np.inf)), np.float32(np.inf))
    xb = np.concatenate((half, twin))
    xq = (half[rng.integers(0, half.shape[0], n_query)] + 0.01).astype(np.float32)
    yb = rng.integers(0, 5, xb.shape[0])
    return xq, rng.integers(0, 5, n_query), xb, yb


def test_bf16_collisions_are_equal_in_bfloat16_only():
    torch = pytest.importorskip("torch")
    _, _, xb, _ = bf16_collisions(200, 1, 0)
    half = torch.from_numpy(xb).bfloat16().float().numpy()
    assert np.array_equal(half[:100], half[100:]) and not np.array_equal(xb[:100], xb[100:])


@pytest.mark.parametrize("make", [near_ties, integer_ties, bf16_collisions])
def test_neighbors_order_is_the_float64_order(make):
    xq, _, xb, _ = make(3000, 60, 1)
    _, idx = ee.neighbors(xq, 20, xb)
    for row, order in enumerate(brute_order(xq, xb)):
        assert idx[row].tolist() == order[:20].tolist()


def test_float32_keys_alone_misorder_the_near_ties():
    """The data above are adversarial: a float32 brute force gets many orders wrong."""
    xq, _, xb, _ = near_ties(3000, 60, 1)
    keys = (xb * xb).sum(axis=1)[None, :] - 2 * xq @ xb.T  # float32
    wrong = sum(
        np.argsort(k, kind="stable")[:20].tolist() != o[:20].tolist()
        for k, o in zip(keys, brute_order(xq, xb), strict=True)
    )
    assert wrong > 30


TORCH_CPU = [
    {"backend": "torch", "device": "cpu", "precision": "float32"},
    {"backend": "torch", "device": "cpu", "precision": "bf16"},
]


@pytest.mark.parametrize("make", [near_ties, integer_ties, bf16_collisions])
def test_split_metrics_equal_float64_and_bit_identical_in_every_backend(make):
    pytest.importorskip("torch")
    # Above 16 column tiles of 2048: the sharded backend cuts the reference into shards.
    xq, yq, xb, yb = make(34_000, 40, 2)
    truth = brute_metrics(xq, yq, xb, yb)
    options = [{}, {"shards": 3}, *TORCH_CPU]
    results = [ee.evaluate(xq, yq, xb, yb, metrics=METRICS, **o) for o in options]
    for name, expected in truth.items():
        # MAP@R sums in the kernels' order: equal to the brute force up to rounding.
        np.testing.assert_allclose(results[0].per_query[name], expected, rtol=0, atol=1e-12)
        for other in results[1:]:
            np.testing.assert_array_equal(other.per_query[name], results[0].per_query[name])


@pytest.mark.parametrize("make", [near_ties, integer_ties, bf16_collisions])
def test_leave_one_out_equals_float64_in_every_engine(make):
    _, _, x, y = make(2000, 10, 3)
    order = brute_order(x, x)
    expected = {"precision_at_1": [], "map_at_r": []}
    for i, o in enumerate(order):
        o = o[o != i]
        rel = y[o] == y[i]
        r = int(rel.sum())
        expected["precision_at_1"].append(float(rel[0]))
        hits = np.flatnonzero(rel[:r])
        expected["map_at_r"].append(float(sum((j + 1) / (h + 1) for j, h in enumerate(hits)) / r))
    options = [{}, *TORCH_CPU, {"n_threads": 1, "block_size": 64}]
    pytest.importorskip("torch")
    results = [ee.evaluate(x, y, metrics=METRICS, **o) for o in options]
    # Full-depth MAP takes the one-sided engine, MAP@R alone the symmetric one.
    results.append(ee.evaluate(x, y, metrics=[*METRICS, "map"]))
    for result in results:
        for name, values in expected.items():
            np.testing.assert_array_equal(result.per_query[name], results[0].per_query[name])
            np.testing.assert_allclose(
                result.per_query[name], values, rtol=0, atol=1e-12, err_msg=name
            )


def test_cosine_positive_multiples_tie_exactly():
    reference = np.array([[3, 3, 0], [0, 1, 0], [1, 1, 0], [2, 0, 1]], dtype=np.float32)
    query = np.array([[1, 2, 0.5]], dtype=np.float32)
    sim, idx = ee.neighbors(query, 4, reference, distance="cosine")
    # cos((1, 2, .5), (1, 1, 0)) = 3 / (sqrt(5.25) sqrt(2)); (3, 3, 0) is the same direction.
    assert idx[0].tolist() == [0, 2, 1, 3]
    assert sim[0, 0] == sim[0, 1]
    assert sim[0, 0] == np.float32(3 / (np.sqrt(5.25) * np.sqrt(2)))


def test_cosine_multiples_take_the_key_of_their_smallest_reference_whatever_the_order():
    """Two multiples of (1, 1) whose own float64 keys differ in the last place against this
    query: listed in either order, both take the key of reference 3 (the smaller index),
    computed here alone with the plain formula -s**2 / ||x||**2."""
    from embedeval.engine.decide import exact_keys

    q = np.float32([1000.0028, 1000.00336])
    a, b = np.float32([1000.00244, 1000.00244]), np.float32([1000.00336, 1000.00336])
    s = float(q[0]) * float(a[0]) + float(q[1]) * float(a[1])
    want = -(s * s) / (float(a[0]) * float(a[0]) + float(a[1]) * float(a[1]))
    q2 = np.stack([q, q])
    alone_b = exact_keys(q2[:1], b[None], "cosine")[0]
    assert alone_b != want  # the two multiples' own keys differ: the choice matters
    for x, refs in (([a, b], [3, 9]), ([b, a], [9, 3])):
        got = exact_keys(q2, np.stack(x), "cosine", np.zeros(2, int), np.array(refs))
        assert got.tolist() == [want, want]


def test_decide_orders_a_cluster_by_float64_keys_then_index():
    x = np.array([[0, 0], [2, 0], [0, 2], [1, 1], [-2, 0]], dtype=np.float32)
    # Float32 keys that pretend 4, 3, 2, 1 are equally near query 0 (within the bound).
    keys = np.array([4.0, 4.0, 4.0, 4.0], dtype=np.float32)
    block = Candidates(np.array([0]), np.array([0, 4]), np.array([4, 3, 2, 1]), sortable_bits(keys))
    out, exact = decide(block, x, x, "euclidean", np.array([1.0]))
    # Squared distances from (0, 0): 4, 2, 4, 4 -> (1, 1) first, then 1, 2, 4 tied by index.
    assert out.index.tolist() == [3, 1, 2, 4]
    assert out.bits.tolist() == [0, 1, 1, 1]
    assert np.nanmax(exact) == 4.0


def test_decide_leaves_well_separated_keys_alone():
    x = np.zeros((3, 2), dtype=np.float32)
    keys = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    block = Candidates(np.array([0]), np.array([0, 3]), np.array([2, 0, 1]), sortable_bits(keys))
    out, exact = decide(block, x, x, "euclidean", np.array([0.1]))
    assert out is block and exact is None


def test_key_bounds_formula():
    # Euclidean: (3 gamma_{d+3} (1 + 2**-20) + 8 gamma64_{d+8}) (||q|| + M)^2, ||q|| = 1, M = 2,
    # d = 5, with gamma_n = n u / (1 - n u).
    g32 = 8 * 2.0**-24 / (1 - 8 * 2.0**-24)
    g64 = 13 * 2.0**-53 / (1 - 13 * 2.0**-53)
    expected = (3 * g32 * (1 + 2.0**-20) + 8 * g64) * 9
    assert key_bounds(np.array([1.0]), 4.0, 5, "euclidean")[0] == pytest.approx(expected, rel=1e-12)
    assert gamma(8) == pytest.approx(8 * 2.0**-24, rel=1e-6)


def test_positives_lists_rank_near_ties_in_float64():
    xq, _, xb, _ = near_ties(3000, 30, 4)
    rng = np.random.default_rng(5)
    positives = [sorted(rng.choice(3000, 4, replace=False).tolist()) for _ in range(30)]
    result = ee.evaluate(xq, None, xb, None, positives=positives, metrics=["map", "precision_at_1"])
    for i, order in enumerate(brute_order(xq, xb)):
        hit = np.isin(order, positives[i])
        ranks = np.flatnonzero(hit) + 1
        ap = float(np.mean(np.arange(1, ranks.size + 1) / ranks))
        assert result.per_query["map"][i] == pytest.approx(ap, abs=1e-12)
        assert result.per_query["precision_at_1"][i] == float(hit[0])


def test_an_outlying_row_does_not_widen_every_querys_band():
    """One row 1000 times farther out than the rest: the band of a query only counts the
    references that can reach its threshold, so the candidates stay few (and exact)."""
    from embedeval.engine.exact import sorted_candidates

    rng = np.random.default_rng(6)
    x = rng.normal(size=(3000, 16)).astype(np.float32)
    x[7] *= 1000
    blocks = list(sorted_candidates(x[:50], x, distance="euclidean", depth=np.full(50, 5)))
    assert max(int(b.counts.max()) for b in blocks) < 300
    y = np.arange(3000) % 300
    truth = brute_metrics(x[:50], y[:50], x, y)
    result = ee.evaluate(x[:50], y[:50], x, y, metrics=METRICS)
    for name, expected in truth.items():
        np.testing.assert_allclose(result.per_query[name], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n_labels", [2, 40])
@pytest.mark.parametrize("make", [near_ties, integer_ties])
def test_full_depth_and_window_metrics_equal_float64_with_many_or_few_relevant(make, n_labels):
    """Few relevant references per query (40 labels: the decision searches around each
    relevant key) and many (2 labels: most candidates are ambiguous, and their float64 keys
    come from a float64 product tile before the fixed-order re-score)."""
    xq, _, xb, _ = make(3000, 50, 4)
    rng = np.random.default_rng(5)
    yq, yb = rng.integers(0, n_labels, xq.shape[0]), rng.integers(0, n_labels, xb.shape[0])
    expected = brute_metrics(xq, yq, xb, yb)
    full = []
    for i, order in enumerate(brute_order(xq, xb)):
        hits = np.flatnonzero(yb[order] == yq[i])
        full.append(sum((j + 1) / (h + 1) for j, h in enumerate(hits)) / hits.size)
    expected["map"] = np.array(full)
    for options in ({}, {"block_size": 7, "n_threads": 1}):
        res = ee.evaluate(xq, yq, xb, yb, metrics=[*METRICS, "map"], **options)
        for name, values in expected.items():
            np.testing.assert_allclose(res.per_query[name], values, rtol=0, atol=1e-12)


def test_inner_product_keys_are_the_fixed_order_float64_sums():
    """References in pairs x, x' (x' swaps coordinates 0 and 2 of x) against queries with
    q_0 = q_2: the real inner products are equal, the float64 sums in column order
    ((q_0 x_0 + q_1 x_1) + q_2 x_2 + ...) round apart or tie, and another summation order
    may round them the other way.  The two members of a pair carry different labels, and
    labels are many, so each query sees a few such relevant / non-relevant near-ties."""
    rng = np.random.default_rng(6)
    d, n_pairs = 6, 3000
    xq = rng.standard_normal((40, d)).astype(np.float32)
    xq[:, 2] = xq[:, 0]
    x = rng.standard_normal((n_pairs, d)).astype(np.float32)
    xb = np.empty((2 * n_pairs, d), dtype=np.float32)
    xb[0::2], xb[1::2] = x, x[:, [2, 1, 0, 3, 4, 5]]
    first = rng.integers(0, 30, n_pairs)
    yb = np.empty(2 * n_pairs, dtype=np.int64)
    yb[0::2], yb[1::2] = first, (first + rng.integers(1, 30, n_pairs)) % 30
    yq = rng.integers(0, 30, xq.shape[0])
    q64, b64 = xq.astype(np.float64), xb.astype(np.float64)
    p1, full = [], []
    for i in range(xq.shape[0]):
        key = np.zeros(xb.shape[0])
        for j in range(d):  # the definition: one column at a time
            key += q64[i, j] * b64[:, j]
        order = np.lexsort((np.arange(xb.shape[0]), -key))
        hits = np.flatnonzero(yb[order] == yq[i])
        p1.append(float(hits[0] == 0))
        full.append(sum((k + 1) / (h + 1) for k, h in enumerate(hits)) / hits.size)
    res = ee.evaluate(xq, yq, xb, yb, metrics=["precision_at_1", "map"], distance="inner_product")
    np.testing.assert_array_equal(res.per_query["precision_at_1"], p1)
    np.testing.assert_allclose(res.per_query["map"], full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("spread", [1.0, 0.05])
def test_positions_near_the_other_kind_include_every_close_pair_of_both_kinds(spread):
    """Flags of positions with a key of the other kind within the band, checked pair by pair:
    exactly those when many neighbours are close (``spread=1``), and when few are
    (``spread=0.05``) a superset of them within chains of close neighbours that hold both
    kinds."""
    from embedeval.engine.decide import _near_other_kind

    rng = np.random.default_rng(4)
    counts = rng.integers(0, 60, 40)
    lims = np.append(0, np.cumsum(counts))
    keys = np.concatenate([np.sort(np.round(rng.random(c) / spread, 2)) for c in counts])
    kind = rng.random(keys.size) < 0.4
    band = np.repeat(rng.choice([0.0, 0.01, 0.02], counts.size), counts)
    got = _near_other_kind(keys, np.repeat(np.arange(counts.size), counts), band, kind)
    n_superset = 0
    for r in range(counts.size):
        k, t, b = keys[lims[r] : lims[r + 1]], kind[lims[r] : lims[r + 1]], band[lims[r]]
        flags = got[lims[r] : lims[r + 1]]
        truth = np.array([(np.abs(k - k[i]) <= b)[t != t[i]].any() for i in range(k.size)])
        assert not np.any(truth & ~flags)
        n_superset += int(np.count_nonzero(flags & ~truth))
        for i in np.flatnonzero(flags):  # within a chain of close neighbours of both kinds
            lo = hi = i
            while lo > 0 and k[lo] - k[lo - 1] <= b:
                lo -= 1
            while hi + 1 < k.size and k[hi + 1] - k[hi] <= b:
                hi += 1
            assert t[lo : hi + 1].any() and not t[lo : hi + 1].all()
    if spread == 1.0:
        assert n_superset == 0


def _chop_to_tf32(a):
    """float32 values with the mantissa chopped to TF32's 10 bits (toward zero: the larger
    of the two input errors a tensor core may make)."""
    bits = np.asarray(a, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return bits.view(np.float32)


def _chopped_sum(terms):
    """float32 sums of the rows of ``terms`` whose every partial sum is chopped toward zero
    (a tensor core's accumulator at its worst), one column at a time."""
    acc = np.zeros(terms.shape[0], dtype=np.float64)
    for j in range(terms.shape[1]):
        exact = acc + terms[:, j]
        acc = np.trunc(exact / _ulp32(exact)) * _ulp32(exact)  # chop to float32's 24 bits
    return acc


def _ulp32(v):
    m = np.maximum(np.abs(v), np.finfo(np.float32).tiny)
    return 2.0 ** (np.floor(np.log2(m)) - 23)


@pytest.mark.parametrize("distance", ["inner_product", "euclidean"])
def test_tf32_bound_covers_chopped_inputs_and_chopping_accumulators(distance):
    """A TF32 product's keys, simulated at their worst (inputs chopped to 10 bits, every
    partial sum chopped), lie within the bound; and the bound is the input rounding's order
    (a few 2**-10 of the magnitude), not a multiple of float32's accumulation error."""
    rng = np.random.default_rng(3)
    d = 256
    q = rng.standard_normal((4000, d)).astype(np.float32)
    x = rng.standard_normal((4000, d)).astype(np.float32)
    x[:2000] = np.abs(x[:2000]) * np.sign(q[:2000])  # all terms positive: errors add up
    x[:1000] = 2 * q[:1000]  # parallel: the sum of |terms| is ||q|| ||x||
    # mantissas 1.0000000001111111111111 (binary): TF32 drops the 13 set bits, almost 2**-10
    q, x = ((a.view(np.uint32) & np.uint32(0xFF800000)) | np.uint32(0x1FFF) for a in (q, x))
    q, x = q.view(np.float32), x.view(np.float32)
    exact = np.einsum("ij,ij->i", q.astype(np.float64), x.astype(np.float64))
    dots = _chopped_sum(_chop_to_tf32(q).astype(np.float64) * _chop_to_tf32(x))
    q_sq = np.einsum("ij,ij->i", q.astype(np.float64), q.astype(np.float64))
    x_sq = np.einsum("ij,ij->i", x.astype(np.float64), x.astype(np.float64))
    scale, input_u = rounding_of("tf32")
    if distance == "inner_product":
        err = np.abs(dots - exact)
        bound = key_bounds(q_sq, x_sq, d, distance, scale, input_u)
        magnitude = np.sqrt(q_sq * x_sq)
    else:  # ||x||^2 (float32, exact enough) - 2 q.x with the TF32 product
        err = 2.0 * np.abs(dots - exact)
        bound = key_bounds(q_sq, x_sq, d, distance, scale, input_u)
        magnitude = (np.sqrt(q_sq) + np.sqrt(x_sq)) ** 2
    assert (err <= bound).all()
    terms = np.abs(q.astype(np.float64) * x).sum(axis=1)
    assert (np.abs(dots - exact) / terms).max() > 1.9 * 2.0**-10  # two chops per term
    assert (bound <= 8 * 2.0**-10 * magnitude).all()


def _integer_block(seed, n_labels):
    """A block of every query's first candidates in float32 key order, as the engine hands
    them over (keys ``||x||^2 - 2 q.x`` from a float32 product, ties by index; some rows empty
    or cut short), over integer rows whose float64 squared distances are exact, with identical
    references; and the float64 squared distances of every pair, computed here."""
    rng = np.random.default_rng(seed)
    xb = rng.integers(-2000, 2000, (300, 6)).astype(np.float32)
    xb[rng.integers(0, 300, 40)] = xb[rng.integers(0, 300, 40)]
    xq = xb[rng.integers(0, 300, 14)] + rng.integers(-2, 3, (14, 6)).astype(np.float32)
    sq = np.einsum("ij,ij->i", xb, xb, dtype=np.float32)
    keys = sq[None, :] - np.float32(2) * (xq @ xb.T)
    counts = rng.integers(0, 301, xq.shape[0])
    counts[[2, 7]] = 0
    order = [np.lexsort((np.arange(300), k))[:c] for k, c in zip(keys, counts, strict=True)]
    index = np.concatenate(order)
    bits = sortable_bits(np.concatenate([k[o] for k, o in zip(keys, order, strict=True)]))
    lims = np.append(0, np.cumsum(counts))
    block = Candidates(np.arange(xq.shape[0]), lims, index, bits)
    truth = ((xq[:, None, :].astype(np.float64) - xb[None, :, :]) ** 2).sum(axis=2)
    m_sq = float(np.einsum("ij,ij->i", xb, xb, dtype=np.float64).max())  # exact: integers
    bounds = key_bounds(np.einsum("ij,ij->i", xq, xq, dtype=np.float64), m_sq, 6, "euclidean")
    labels = rng.integers(0, n_labels, 300), rng.integers(0, n_labels, xq.shape[0])
    return xq, xb, block, truth, bounds, labels


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n_labels", [2, 40])
def test_decide_orders_every_relevant_and_other_pair_as_float64_does(seed, n_labels):
    """Per row, checked pair by pair against float64 distances computed here: the candidates
    are the same; a relevant and a non-relevant one are in float64 order, and when their
    distances are equal they lie in one run of equal tie codes; neighbours of different
    kinds with equal codes have equal distances.  Many relevant candidates (2 labels) and
    few (40) take different searches."""
    xq, xb, block, truth, bounds, (yb, yq) = _integer_block(seed, n_labels)
    relevant = yb[block.index] == np.repeat(yq, block.counts)
    out, _ = decide(block, xq, xb, "euclidean", bounds, relevant)
    n_ties = 0
    for r in range(block.counts.size):
        a, b = block.lims[r], block.lims[r + 1]
        idx, codes = out.index[a:b], out.bits[a:b]
        assert sorted(idx.tolist()) == sorted(block.index[a:b].tolist())
        d, rel = truth[r, idx], yb[idx] == yq[r]
        for i in range(idx.size):
            for j in range(i + 1, idx.size):
                if rel[i] != rel[j]:
                    one_run = bool(np.all(codes[i : j + 1] == codes[i]))
                    assert d[i] < d[j] or (d[i] == d[j] and one_run)
                    n_ties += int(d[i] == d[j])
        tied = (codes[1:] == codes[:-1]) & (rel[1:] != rel[:-1])
        assert np.array_equal(d[1:][tied], d[:-1][tied])
    assert n_ties > 0  # the data holds exact ties of both kinds


@pytest.mark.parametrize("seed", range(4))
def test_decide_without_relevance_sorts_rows_by_float64_then_index(seed):
    """No relevance flags: each row in the order of float64 distances (computed here), equal
    ones by reference index, and neighbours' tie codes equal exactly where the distances are."""
    xq, xb, block, truth, bounds, _ = _integer_block(seed, 2)
    out, _ = decide(block, xq, xb, "euclidean", bounds)
    for r in range(block.counts.size):
        a, b = block.lims[r], block.lims[r + 1]
        idx, codes = out.index[a:b], out.bits[a:b]
        want = block.index[a:b][np.lexsort((block.index[a:b], truth[r, block.index[a:b]]))]
        assert idx.tolist() == want.tolist()
        d = truth[r, idx]
        assert np.array_equal(codes[1:] == codes[:-1], d[1:] == d[:-1])


def test_band_positions_find_every_key_within_the_width_however_far():
    """The positions of a row whose float32 key lies within ``width`` of a candidate's key,
    against a scan of the row written here: rows of long runs of equal keys (bands reaching
    far beyond the positions searched first) and of distinct ones, empty rows between."""
    from embedeval.engine.decide import _band_positions

    rng = np.random.default_rng(5)
    rows = [np.sort(rng.integers(0, 6, c)).astype(np.float32) for c in (70, 0, 40, 3, 0, 90)]
    rows += [np.sort(rng.standard_normal(120).astype(np.float32))]
    counts = np.array([r.size for r in rows])
    lims = np.append(0, np.cumsum(counts))
    keys = np.concatenate(rows)
    block = Candidates(np.arange(counts.size), lims, np.arange(keys.size), sortable_bits(keys))
    at = np.sort(rng.choice(keys.size, 60, replace=False))
    width = rng.choice([0.0, 0.5, 1.0, 2.5, 0.01], at.size)
    lo, hi = _band_positions(block, at, width)
    for i, p in enumerate(at.tolist()):
        r = int(np.searchsorted(lims, p, side="right")) - 1
        k = keys[lims[r] : lims[r + 1]].astype(np.float64)
        centre = float(keys[p])
        assert lo[i] == lims[r] + int(np.count_nonzero(k < centre - width[i]))
        assert hi[i] == lims[r] + int(np.count_nonzero(k <= centre + width[i]))
