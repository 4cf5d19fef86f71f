"""CFT's confidence bins are the metrics' bins: ``hf_calibration.metrics.binning.uniform_bin_index``."""

import numpy as np
import torch

from hf_calibration.calm.strategies import confidence_bins
from hf_calibration.metrics.binning import uniform_bin_index
from tests.calm.test_trainer import make_trainer


def test_confidence_bins_equal_the_metrics_rule_at_every_edge():
    # float32 confidences at, just below and just above every edge k/B: uniform_bin_index on their exact
    # float64 values is the reference (module docstring of hf_calibration.metrics.binning)
    for n_bins in (10, 15, 100):
        edges = np.arange(n_bins + 1) / n_bins
        near = np.concatenate([np.float32(edges), np.nextafter(np.float32(edges), np.float32(0)),
                               np.nextafter(np.float32(edges), np.float32(1))]).astype(np.float32)
        conf = torch.from_numpy(np.clip(near, 0, 1))
        expected = torch.from_numpy(uniform_bin_index(conf.double().numpy(), n_bins)).long()
        assert torch.equal(confidence_bins(conf, n_bins), expected)
        # float32(0.7) = 0.699999988 is below the edge 0.7, though 0.699999988 * 10 rounds to 7.0 in float32
    assert confidence_bins(torch.tensor([np.float32(0.7)]), 10).tolist() == [6]
    assert confidence_bins(torch.tensor([0.0, 1.0]), 10).tolist() == [0, 9]


def test_cft_bin_accuracies_bin_like_the_metrics(tmp_path, tiny_tokenizer, mcqa_data):
    """Every training example scored at confidence float32(0.7), all correct: bin 6 = [0.6, 0.7) holds them all.

    The old rule ``clamp((conf * bins).long(), max=bins - 1)`` in float32 put them in bin 7, so bin 7 read 1.0
    and bin 6 its centre 0.65.
    """
    trainer = make_trainer(tmp_path, tiny_tokenizer, mcqa_data, method="cft", cft_num_bins=10)
    row = torch.log(torch.tensor([0.7, 0.1, 0.1, 0.1], dtype=torch.float32))
    assert float(row.exp()[0].double()) < 0.7  # exp(log(float32(0.7))) is float32(0.7) again
    trainer.log_probs = lambda raw, alpha: row.expand(raw.shape[0], 4)
    trainer.targets = lambda ids: torch.zeros(len(ids), dtype=torch.long)  # argmax 0 is always right
    accuracy, count = trainer.strategy.bin_statistics()
    expected = (torch.arange(10) + 0.5) / 10  # empty bins: their centre
    expected[6] = 1.0
    torch.testing.assert_close(accuracy, expected, rtol=0, atol=0)
    assert count.tolist() == [0] * 6 + [16] + [0] * 3  # the 16 training examples, all in bin 6


# ---- the CFT term (hf_calibration.calm.cft; issue 17.4) ------------------------------------------------------
#
# A 3-example, K = 4 batch, 10 bins; bin accuracies and training-set counts: bin 4 → a = 1/2, N = 4; bin 6 →
# a = 3/4, N = 8. Each item's non-maximum probabilities s (sorted) are chosen so that γ·s_j = ln 3/(1 − a)·s_j/s_1
# is an integer multiple k of ln 3, where tanh(k ln 3) = (3^(2k) − 1)/(3^(2k) + 1) is rational:
#
#   item  p                          conf  bin  a    s (sorted)          k_j = s_j/s_1/(1 − a)
#   1     (0.65, 0.20, 0.10, 0.05)   0.65  6    3/4  0.20, 0.10, 0.05    4, 2, 1
#   2     (0.14, 0.44, 0.28, 0.14)   0.44  4    1/2  0.28, 0.14, 0.14    2, 1, 1
#   3     (0.06, 0.24, 0.06, 0.64)   0.64  6    3/4  0.24, 0.06, 0.06    4, 1, 1
#
# tanh(ln 3) = 8/10, tanh(2 ln 3) = 80/82, tanh(4 ln 3) = 6560/6562. Item 1: T = Σ tanh = 2.7753050,
# A = (1 − a)/(T + 3) = 0.0432878, t = A(tanh + 1) = (0.0865623, 0.0855197, 0.0779180) (sum 0.25 = 1 − a),
# error (0.65 − 0.75)² + Σ (s − t)² = 0.0238572. Item 2: T = 2.5756098, A = 0.0896763,
# t = (0.1771654, 0.1614173, 0.1614173), error 0.0150924. Item 3: T = 2.5996952, A = 0.0446453,
# t = (0.0892770, 0.0803615, 0.0803615), error 0.0356466.
# term = 0.0238572/8 + 0.0150924/4 + 0.0356466/8 = 0.0112111.

from fractions import Fraction  # noqa: E402

import pytest  # noqa: E402

from hf_calibration.calm.cft import cft_item_errors, cft_term, non_max_target  # noqa: E402

HAND_PROBS = [[0.65, 0.20, 0.10, 0.05], [0.14, 0.44, 0.28, 0.14], [0.06, 0.24, 0.06, 0.64]]
HAND_BINS = [6, 4, 6]
HAND_ACCURACY = [0.05, 0.15, 0.25, 0.35, 0.5, 0.55, 0.75, 0.75, 0.85, 0.95]  # bins 4 and 6 matter
HAND_COUNT = [0, 3, 0, 0, 4, 0, 8, 0, 0, 0]


def _tanh_k_ln3(k):
    return Fraction(3 ** (2 * k) - 1, 3 ** (2 * k) + 1)


def _hand_errors():
    """The three items' errors in exact rational arithmetic, from the table above."""
    items = [(Fraction(65, 100), Fraction(3, 4), [Fraction(20, 100), Fraction(10, 100), Fraction(5, 100)], [4, 2, 1]),
             (Fraction(44, 100), Fraction(1, 2), [Fraction(28, 100), Fraction(14, 100), Fraction(14, 100)], [2, 1, 1]),
             (Fraction(64, 100), Fraction(3, 4), [Fraction(24, 100), Fraction(6, 100), Fraction(6, 100)], [4, 1, 1])]
    errors = []
    for conf, a, s, ks in items:
        squashed = [_tanh_k_ln3(k) for k in ks]
        weight = (1 - a) / (sum(squashed) + 3)
        target = [weight * (x + 1) for x in squashed]
        assert sum(target) == 1 - a
        errors.append((conf - a) ** 2 + sum((sj - tj) ** 2 for sj, tj in zip(s, target)))
    return errors


def test_cft_term_by_hand():
    errors = _hand_errors()
    assert [float(e) for e in errors] == pytest.approx([0.0238572, 0.0150924, 0.0356466], abs=1e-7)
    expected = float(errors[0] / 8 + errors[1] / 4 + errors[2] / 8)
    assert expected == pytest.approx(0.0112111, abs=1e-7)
    probs = torch.tensor(HAND_PROBS, dtype=torch.float64)
    bins = torch.tensor(HAND_BINS)
    assert torch.equal(confidence_bins(probs.max(dim=1).values, 10), bins)  # the table's bins
    got = cft_term(probs, bins, torch.tensor(HAND_ACCURACY), torch.tensor(HAND_COUNT, dtype=torch.float32))
    # float64 throughout (the inputs 0.65 … are within 2^-53 relative of the table's decimals), a few dozen
    # operations of magnitude ≤ 1: 1e-14 is ~50 units in the last place
    assert float(got) == pytest.approx(expected, rel=0, abs=1e-14)
    # the per-item errors, and the earlier rule ('uniform' target, mean over the batch's 3 items) by hand:
    # item 1: (0.65 − 0.75)² + (0.20 − 1/12)² + (0.10 − 1/12)² + (0.05 − 1/12)² = 0.0250000; item 2:
    # (0.44 − 0.5)² + (0.28 − 1/6)² + 2·(0.14 − 1/6)² = 0.0178667; item 3: (0.64 − 0.75)² + (0.24 − 1/12)²
    # + 2·(0.06 − 1/12)² = 0.0377333; mean 0.0268667
    accuracy = torch.tensor(HAND_ACCURACY, dtype=torch.float64)[bins]
    assert cft_item_errors(probs, accuracy).tolist() == pytest.approx([float(e) for e in errors], rel=0, abs=1e-14)
    old = cft_term(probs, bins, torch.tensor(HAND_ACCURACY), torch.tensor(HAND_COUNT), rule="uniform",
                   normalization="batch_mean", items=3)
    assert float(old) == pytest.approx(0.0268667, abs=1e-7)


@pytest.mark.parametrize("rule", ["tanh", "proportional"])
def test_non_max_target_keeps_the_order_and_sums_to_one_minus_accuracy(rule):
    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(200, 6, generator=generator, dtype=torch.float64), dim=1)
    non_max = probs.sort(dim=1, descending=True).values[:, 1:]
    accuracy = torch.rand(200, generator=generator, dtype=torch.float64)
    accuracy[:3] = torch.tensor([0.0, 1.0, 0.5])
    target = non_max_target(non_max, accuracy, rule)
    # the targets rank the options as the model does: non-increasing along the sorted s (ties stay ties) ...
    assert bool((target[:, :-1] >= target[:, 1:]).all())
    # ... and strictly where s strictly decreases; tanh saturates (tanh(x) rounds to 1 in float64 from x ≈ 19),
    # so for 'tanh' only where γ·s_j = ln 3/(1 − a)·s_j/s_1 ≤ 10 (1 − tanh(10) = 4e-9, far above rounding)
    strictly = (non_max[:, :-1] > non_max[:, 1:]) & (accuracy[:, None] < 1)
    if rule == "tanh":
        strictly &= (torch.log(torch.tensor(3.0, dtype=torch.float64)) / (1 - accuracy[:, None]) * non_max[:, :-1]
                     / non_max[:, :1]) <= 10
    assert int(strictly.sum()) > 100
    assert bool((target[:, :-1] > target[:, 1:])[strictly].all())
    # float64 sums of 5 terms ≤ 1: 1e-15 is a few units in the last place
    torch.testing.assert_close(target.sum(dim=1), 1 - accuracy, rtol=0, atol=1e-15)
    assert bool((target[1] == 0).all())  # a bin that is always right leaves nothing to the other options


def test_trainer_step_uses_the_training_set_bin_counts(tmp_path, tiny_tokenizer, mcqa_data):
    """One CFT step on the 3 hand items (their probabilities put in place of the model's): the logged term is
    the hand value, i.e. the trainer divides each item by its bin's training-set count, not by the batch size."""
    trainer = make_trainer(tmp_path, tiny_tokenizer, mcqa_data, method="cft", cft_num_bins=10)
    fixed = torch.tensor(HAND_PROBS).log()
    trainer.log_probs = lambda raw, alpha: fixed + 0 * raw[:, :1]  # keeps a graph to differentiate
    strategy = trainer.strategy
    strategy.bin_accuracy, strategy.bin_count = torch.tensor(HAND_ACCURACY), torch.tensor(HAND_COUNT, dtype=torch.float)
    trainer.create_optimizer()
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
    trainer.training_step(trainer.model, batch)
    logged = trainer._metrics["train"]["cft_term"]  # TRL's per-split log buffer: no public reader before log()
    # float32 probabilities (relative error ≤ 2^-24 each) through ~30 operations of magnitude ≤ 1: 1e-6
    assert logged == [pytest.approx(float(sum(e / n for e, n in zip(_hand_errors(), (8, 4, 8)))), abs=1e-6)]
