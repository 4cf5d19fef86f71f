"""CFT's confidence bins are the metrics' bins: ``hf_calibration.metrics.binning.uniform_bin_index``."""

import numpy as np
import torch

from hf_calibration.calm.trainer import _confidence_bins
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
        assert torch.equal(_confidence_bins(conf, n_bins), expected)
        # float32(0.7) = 0.699999988 is below the edge 0.7, though 0.699999988 * 10 rounds to 7.0 in float32
    assert _confidence_bins(torch.tensor([np.float32(0.7)]), 10).tolist() == [6]
    assert _confidence_bins(torch.tensor([0.0, 1.0]), 10).tolist() == [0, 9]


def test_cft_bin_accuracies_bin_like_the_metrics(tmp_path, tiny_tokenizer, mcqa_data):
    """Every training example scored at confidence float32(0.7), all correct: bin 6 = [0.6, 0.7) holds them all.

    The old rule ``clamp((conf * bins).long(), max=bins - 1)`` in float32 put them in bin 7, so bin 7 read 1.0
    and bin 6 its centre 0.65.
    """
    trainer = make_trainer(tmp_path, tiny_tokenizer, mcqa_data, method="cft", cft_num_bins=10)
    row = torch.log(torch.tensor([0.7, 0.1, 0.1, 0.1], dtype=torch.float32))
    assert float(row.exp()[0].double()) < 0.7  # exp(log(float32(0.7))) is float32(0.7) again
    trainer._log_probs = lambda raw, alpha: row.expand(raw.shape[0], 4)
    trainer._targets = lambda ids: torch.zeros(len(ids), dtype=torch.long)  # argmax 0 is always right
    accuracy = trainer._cft_bin_accuracies()
    expected = (torch.arange(10) + 0.5) / 10  # empty bins: their centre
    expected[6] = 1.0
    torch.testing.assert_close(accuracy, expected, rtol=0, atol=0)
