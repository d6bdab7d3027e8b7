"""Sampler and vocabulary-constraint unit tests (no engine)."""

from __future__ import annotations

import pytest
import torch

from mstar.engine.sampler import Sampler, VocabColumns, apply_repetition_penalty, filter_top_k_top_p, history_columns
from mstar.layers.vocab_constraint import _find_runs, contiguous_runs, union_vocab
from mstar.sampling_params import SamplingParams


def kept(row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(row)).reshape(-1).tolist())


def nucleus_reference(logits: torch.Tensor, p: float) -> set[int]:
    """Smallest set of most likely tokens whose probability reaches p (independent of the sampler)."""
    probs = torch.softmax(logits.double(), -1).tolist()
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    out, total = set(), 0.0
    for i in order:
        out.add(i)
        total += probs[i]
        if total >= p:
            break
    return out


# ---- repetition penalty -------------------------------------------------------------


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    row = torch.tensor([2.0, -2.0, 3.0, -1.0, 0.5])
    apply_repetition_penalty(row, torch.tensor([0, 1, 4]), 2.0)
    assert row.tolist() == [1.0, -4.0, 3.0, -1.0, 0.25]  # cols 2, 3 untouched


def test_repetition_penalty_below_one_boosts_seen_tokens():
    row = torch.tensor([2.0, -2.0])
    apply_repetition_penalty(row, torch.tensor([0, 1]), 0.5)
    assert row.tolist() == [4.0, -1.0]


def test_repetition_penalty_one_or_no_history_is_a_no_op():
    row = torch.tensor([2.0, -2.0])
    apply_repetition_penalty(row, torch.tensor([0, 1]), 1.0)
    apply_repetition_penalty(row, torch.tensor([], dtype=torch.long), 3.0)
    assert row.tolist() == [2.0, -2.0]


def test_history_columns_full_and_restricted_vocab():
    assert history_columns([5, 3, 5, 9], None, torch.device("cpu")).tolist() == [3, 5, 9]
    vocab = torch.tensor([3, 4, 9, 20])
    # 3 -> column 0, 9 -> column 2; 5 and 25 are outside the restricted vocabulary
    assert history_columns([5, 3, 9, 25], vocab, torch.device("cpu")).tolist() == [0, 2]
    assert history_columns([], vocab, torch.device("cpu")).tolist() == []


# ---- top-k / top-p --------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 5, 17, 49])
def test_top_k_keeps_exactly_the_k_largest(k):
    g = torch.Generator().manual_seed(k)
    row = torch.randn(50, generator=g)
    out = filter_top_k_top_p(row, k, 1.0)
    assert kept(out) == set(torch.topk(row, k).indices.tolist())
    assert torch.equal(out[torch.isfinite(out)], row[torch.isfinite(out)])  # survivors unchanged


def test_top_k_zero_or_at_least_vocab_is_a_no_op():
    row = torch.randn(10)
    assert torch.equal(filter_top_k_top_p(row, 0, 1.0), row)
    assert torch.equal(filter_top_k_top_p(row, 10, 1.0), row)
    assert torch.equal(filter_top_k_top_p(row, 99, 1.0), row)


def test_top_p_keeps_the_nucleus():
    row = torch.log(torch.tensor([0.5, 0.05, 0.3, 0.15], dtype=torch.float64))
    assert kept(filter_top_k_top_p(row, 0, 0.75)) == {0, 2}
    assert kept(filter_top_k_top_p(row, 0, 0.85)) == {0, 2, 3}
    assert kept(filter_top_k_top_p(row, 0, 0.4)) == {0}
    assert kept(filter_top_k_top_p(row, 0, 0.99)) == {0, 1, 2, 3}


@pytest.mark.parametrize("seed", range(5))
def test_top_p_matches_an_independent_nucleus(seed):
    g = torch.Generator().manual_seed(seed)
    row = torch.randn(40, generator=g, dtype=torch.float64) * 2
    for p in (0.05, 0.2, 0.5, 0.7, 0.9, 0.97):
        assert kept(filter_top_k_top_p(row, 0, p)) == nucleus_reference(row, p), p


def test_top_p_always_keeps_the_most_likely_token():
    row = torch.tensor([0.0, 5.0, 1.0])
    assert kept(filter_top_k_top_p(row, 0, 1e-6)) == {1}


def test_top_p_applies_to_the_top_k_renormalized_distribution():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    row = torch.log(probs)
    # without top-k, p = 0.75 needs 3 tokens (0.4 + 0.3 < 0.75)
    assert kept(filter_top_k_top_p(row, 0, 0.75)) == {0, 1, 2}
    # after top-3 the distribution is (4/9, 3/9, 2/9): 4/9 + 3/9 = 0.78 reaches 0.75 with 2
    assert kept(filter_top_k_top_p(row, 3, 0.75)) == {0, 1}
    # after top-2 it is (4/7, 3/7): p = 0.6 needs both
    assert kept(filter_top_k_top_p(row, 2, 0.6)) == {0, 1}


# ---- Sampler -------------------------------------------------------------------------


def gens(n, seed=0):
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def test_greedy_is_argmax_and_maps_restricted_columns_to_ids():
    s = Sampler()
    logits = torch.tensor([[0.1, 3.0, 2.0], [5.0, 1.0, 0.0]])
    p = SamplingParams()
    assert s.sample(logits, None, [p, p], [[], []], [None, None]) == [1, 0]
    vocab = torch.tensor([10, 40, 77])
    assert s.sample(logits, vocab, [p, p], [[], []], [None, None]) == [40, 10]


def test_greedy_with_repetition_penalty_avoids_seen_token():
    s = Sampler()
    logits = torch.tensor([[3.0, 2.0, -1.0]])
    p = SamplingParams(repetition_penalty=2.0)
    assert s.sample(logits.clone(), None, [p], [[0]], [None]) == [1]  # 3/2 = 1.5 < 2
    assert s.sample(logits.clone(), None, [p], [[2]], [None]) == [0]
    # restricted vocab: history id 7 is column 0
    assert s.sample(logits.clone(), torch.tensor([7, 8, 9]), [p], [[7]], [None]) == [8]


def test_sampler_does_not_modify_the_callers_logits():
    s = Sampler()
    logits = torch.tensor([[3.0, 2.0, -1.0]])
    before = logits.clone()
    s.sample(logits, None, [SamplingParams(temperature=1.0, top_k=2, repetition_penalty=3.0)], [[0, 2]], gens(1))
    assert torch.equal(logits, before)


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    s = Sampler()
    logits = torch.randn(1, 60, generator=torch.Generator().manual_seed(1))
    p = SamplingParams(temperature=1.5)

    def draw(seed):
        g = torch.Generator().manual_seed(seed)
        return [s.sample(logits, None, [p], [[]], [g])[0] for _ in range(40)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_sampled_tokens_stay_inside_top_k_and_nucleus():
    s = Sampler()
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(3)) * 3
    topk = set(torch.topk(logits[0], 5).indices.tolist())
    nucleus = nucleus_reference(logits[0], 0.6)
    g = torch.Generator().manual_seed(0)
    seen_k, seen_p = set(), set()
    for _ in range(300):
        seen_k.add(s.sample(logits, None, [SamplingParams(temperature=1.0, top_k=5)], [[]], [g])[0])
        seen_p.add(s.sample(logits, None, [SamplingParams(temperature=1.0, top_p=0.6)], [[]], [g])[0])
    assert seen_k <= topk and len(seen_k) > 1
    assert seen_p <= nucleus


def test_sampling_frequencies_follow_softmax_of_scaled_logits():
    s = Sampler()
    logits = torch.tensor([[1.0, 0.0, -1.0, 2.0]])
    t = 2.0
    p = SamplingParams(temperature=t)
    g = torch.Generator().manual_seed(0)
    n = 4000
    counts = torch.zeros(4)
    for _ in range(n):
        counts[s.sample(logits, None, [p], [[]], [g])[0]] += 1
    expected = torch.softmax(logits[0] / t, -1)
    assert torch.allclose(counts / n, expected, atol=0.03), (counts / n, expected)


def test_tiny_temperature_is_effectively_greedy():
    s = Sampler()
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(5))
    p = SamplingParams(temperature=1e-4)
    assert s.sample(logits, None, [p] * 4, [[]] * 4, gens(4)) == logits.argmax(-1).tolist()


def test_mixed_batch_greedy_rows_stay_greedy():
    s = Sampler()
    logits = torch.randn(3, 30, generator=torch.Generator().manual_seed(6))
    params = [SamplingParams(), SamplingParams(temperature=1.0, top_k=1), SamplingParams()]
    out = s.sample(logits, None, params, [[]] * 3, gens(3))
    assert out == logits.argmax(-1).tolist()  # top_k=1 sampling is argmax too


# ---- SamplingParams ------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.1),
        ("top_k", -1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("repetition_penalty", 0.0),
        ("max_tokens", 0),
    ],
)
def test_sampling_params_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"sampling.{field}"):
        SamplingParams(**{field: value})


def test_sampling_params_from_dict_rejects_unknown_fields():
    assert SamplingParams.from_dict({"temperature": 0.5, "seed": 3}).seed == 3
    with pytest.raises(ValueError, match="sampling"):
        SamplingParams.from_dict({"temprature": 0.5})


def test_batched_rows_sample_as_each_row_alone():
    """One call for the batch gives each row the token it gets alone with the same generator (ties
    included: bf16-rounded logits have many)."""
    vocab = union_vocab([[(1000, 1300)]], torch.device("cpu"))
    logits = (torch.randn(6, 300, generator=torch.Generator().manual_seed(9)) * 3).bfloat16().float()
    nucleus = SamplingParams(temperature=0.6, top_p=0.8, repetition_penalty=1.3)
    params = [
        nucleus,
        SamplingParams(),
        nucleus,
        SamplingParams(temperature=0.9, top_k=20, top_p=0.5),
        nucleus,
        nucleus,
    ]
    histories = [[1000 + (7 * i * j) % 300 for j in range(40)] for i in range(6)]
    for trial in range(5):
        together = Sampler().sample(logits, vocab, params, histories, gens(6, seed=10 * trial))
        alone = [
            Sampler().sample(
                logits[i : i + 1], vocab, [params[i]], [histories[i]], gens(6, seed=10 * trial)[i : i + 1]
            )[0]
            for i in range(6)
        ]
        assert together == alone


def test_vocab_columns_match_history_columns():
    vocab = torch.tensor([3, 4, 5, 9, 12, 13])
    columns = VocabColumns(max_kept=2)
    history = [13, 4, 4, 7, 100, 3]
    for _ in range(2):  # the second time from the kept entry
        assert (
            columns.columns(history, vocab, torch.device("cpu")).tolist()
            == history_columns(history, vocab, torch.device("cpu")).tolist()
        )
    assert columns.ids(vocab, [0, 5, 3]) == [3, 13, 9]
    history.extend([5, 12, 1000])  # a history grows: only its new tokens are read, the columns stay right
    assert columns.columns(history, vocab, torch.device("cpu")).tolist() == [0, 1, 2, 4, 5]
    shorter = history[:2]  # another list (a fork's copy): its own columns
    assert columns.columns(shorter, vocab, torch.device("cpu")).tolist() == [1, 5]
    for n in range(4):  # past max_kept: still right
        other = torch.arange(n, n + 3)
        assert columns.ids(other, [2]) == [n + 2]


# ---- vocabulary constraints ---------------------------------------------------------


def test_contiguous_runs_of_union_vocab_are_kept_and_right():
    ids = union_vocab([[(10, 14), (20, 22)]], torch.device("cpu"))
    assert contiguous_runs(ids) == _find_runs(ids, 8) == [(10, 14), (20, 22)]
    assert contiguous_runs(ids, max_runs=1) is None  # another limit is not taken from the kept runs
    assert contiguous_runs(torch.tensor([1, 2, 5])) == [(1, 3), (5, 6)]  # any other tensor: found anew


def test_union_vocab():
    ranges = [[(0, 3)], [(5, 7), (1, 2)]]
    assert union_vocab(ranges, torch.device("cpu")).tolist() == [0, 1, 2, 5, 6]


def test_union_vocab_none_when_any_row_is_unconstrained():
    assert union_vocab([[(0, 3)], None], torch.device("cpu")) is None


def test_vocab_columns_keep_every_slot_vocabulary_of_the_live_histories(monkeypatch):
    import mstar.engine.sampler as sampler_module

    built: list[int] = []

    class CountedSeen(sampler_module._SeenColumns):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(1)

    monkeypatch.setattr(sampler_module, "_SeenColumns", CountedSeen)
    cpu = torch.device("cpu")
    slots = [torch.arange(10 * k, 10 * k + 10) for k in range(7)]  # Orpheus-like: 7 slot vocabularies
    columns = VocabColumns(max_histories=4)
    histories = [[0, 11, 25], [3, 47], [69]]
    for step in range(3):  # 3 sequences x 7 vocabularies = 21 pairs, far past 4 histories' worth
        for history in histories:
            for vocab in slots:
                got = columns.columns(history, vocab, cpu)
                assert got.tolist() == history_columns(history, vocab, cpu).tolist()
            history.append(10 * step + 5)
    assert len(built) == 3 * 7  # built once each, then brought up to date
    for n in range(5):  # more live histories than it keeps: the least recently used goes
        columns.columns([n], slots[0], cpu)
    assert len(built) == 3 * 7 + 5 and len(columns._seen) == 4


# ---- wide rows: the nucleus found among the top candidates, or by a full sort ------------


@pytest.mark.parametrize("scale", [0.3, 3.0, 30.0])  # flat (nucleus of thousands) to peaked (a few)
def test_top_p_on_wide_batches_matches_an_independent_nucleus(scale):
    g = torch.Generator().manual_seed(int(scale * 10))
    rows = torch.randn(4, 4097, generator=g, dtype=torch.float64) * scale
    rows[1] *= 20  # one peaked row beside flat ones: the batch needs the full sort for the others
    for p in (0.1, 0.8, 0.95):
        out = filter_top_k_top_p(rows, 0, p)
        for r in range(rows.shape[0]):
            assert kept(out[r]) == nucleus_reference(rows[r], p), (scale, p, r)
        assert torch.equal(out[torch.isfinite(out)], rows[torch.isfinite(out)])  # survivors unchanged


def test_top_p_nucleus_wider_than_the_candidates_is_found_by_the_full_sort():
    from mstar.engine.sampler import NUCLEUS_CANDIDATES

    row = torch.zeros(1, 4 * NUCLEUS_CANDIDATES, dtype=torch.float64)  # uniform: p = 0.5 needs half of them
    assert len(kept(filter_top_k_top_p(row, 0, 0.5)[0])) == 2 * NUCLEUS_CANDIDATES


# ---- the draw -----------------------------------------------------------------------------


def test_draw_follows_the_probabilities_and_never_picks_a_zero():
    from mstar.engine.sampler import draw

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.2, 0.3, 0.0]])
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(6)
    n = 20000
    for _ in range(n):
        counts[draw(probs, [g])[0]] += 1
    assert counts[[0, 2, 5]].sum() == 0
    # binomial standard deviation at n = 20000 is at most 0.0036: 5 sigma
    assert torch.allclose(counts / n, probs[0].float(), atol=0.018)


def test_draw_at_the_ends_of_the_unit_interval_stays_on_nonzero_columns(monkeypatch):
    from mstar.engine import sampler

    probs = torch.tensor([[0.0, 0.3, 0.7, 0.0], [1 / 3, 1 / 3, 1 / 3, 0.0]])
    for u, expected in ((0.0, [1, 0]), (1.0 - 2**-53, [2, 2])):  # torch.rand's least and largest values
        monkeypatch.setattr(sampler.torch, "rand", lambda *a, u=u, **k: torch.tensor([u], dtype=torch.float64))
        assert sampler.draw(probs, [None, None]) == expected


def test_draw_uses_each_rows_own_generator():
    from mstar.engine.sampler import draw

    probs = torch.full((3, 50), 1 / 50)
    together = draw(probs, gens(3, seed=7))
    alone = [draw(probs[i : i + 1], gens(3, seed=7)[i : i + 1])[0] for i in range(3)]
    assert together == alone


@pytest.mark.parametrize("seed", range(3))
def test_top_p_on_wide_float32_rows_matches_the_fp64_nucleus(seed):
    # the nucleus is found on fp64 probabilities: float32 logits meet the fp64 reference at the boundary
    g = torch.Generator().manual_seed(100 + seed)
    rows = torch.randn(8, 4097, generator=g) * torch.tensor([0.2, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0])[:, None]
    out = filter_top_k_top_p(rows, 0, 0.8)
    for r in range(rows.shape[0]):
        assert kept(out[r]) == nucleus_reference(rows[r], 0.8), r


@pytest.mark.parametrize("bad", ["nan", "+inf", "all masked"])
def test_a_row_that_is_not_a_distribution_raises_instead_of_drawing_past_the_vocabulary(bad):
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(4))
    if bad == "nan":
        logits[1, 7] = float("nan")
    elif bad == "+inf":
        logits[1, 3] = float("inf")
    else:
        logits[1] = float("-inf")
    params = [SamplingParams(temperature=0.7, top_p=0.9)] * 3
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        Sampler().sample(logits, None, params, [[], [], []], gens(3))


def test_draw_refuses_rows_that_are_not_distributions():
    from mstar.engine.sampler import draw

    probs = torch.tensor([[0.5, 0.5], [float("nan"), 0.5], [0.0, 0.0]])
    with pytest.raises(ValueError, match=r"rows \[1, 2\]"):
        draw(probs, [None] * 3)
