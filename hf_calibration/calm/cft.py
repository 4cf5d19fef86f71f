"""CFT's calibration term (Xiao et al., ICML 2025, "Restoring Calibration for Aligned LLMs: A Calibration-Aware
Fine-Tuning Approach", arXiv 2505.01997; code ZhanliangAaronWang/RestoreLLMCalibration), as ``CALMTrainer`` uses
it for method='cft' (docs/methods.md, 'CALM: CFT baseline').

The loss of an optimizer step is (1 − a)·L_tr + a·c·term with

    term = Σ_{items i of the step} [(conf_i − acc_b)² + Σ_{j ≠ argmax} (p_ij − t_ij)²] / N_b,   b = bin(conf_i),

conf_i = max_j p_ij, acc_b and N_b the accuracy and the number of items of confidence bin b in a pass over the
training data, and t_ij the target of the non-maximum probabilities. Grouped by bin this is the paper summary's
Σ_bins[(max-conf − bin acc)² + (non-max conf − target)²]/count.

What is taken from the CFT code (stored copy of the repository: top-level files at commit 62a3afc,
``Supplementary_Material/`` at 8bbfc9c; read, not run):
``train/Custom_Trainer.py`` (``compute_calibration_loss``: per bin, the squared errors of the batch's items summed
in float64 and divided by ``total_count[k]``, the bin's count over the training set; the loss
``(1 − alpha)·sft + alpha·calibration·1e-3``), ``utils/not_max_target_confidence_new.py`` (the target below),
``utils/confidence_max_nb.py`` (non-maximum probabilities sorted in descending order; bins of the detached
maximum probability) and ``Supplementary_Material/train/trainer.py`` (bin accuracies and counts from one pass of
the initial model over the training data, before training). Nothing in that code detaches the target, so the
gradient also flows through t (as here).

The non-maximum target (``non_max_target``), for an item with non-maximum probabilities s_1 ≥ … ≥ s_{K−1} in a
bin of accuracy a:

- ``"tanh"`` (the CFT code): t_j = A·(tanh(γ·s_j) + 1) with γ = ln 3 / (s_1·(1 − a)) and
  A = (1 − a) / (Σ_j tanh(γ·s_j) + K − 1); t = 0 when a = 1. The targets keep the order of the s_j (tanh is
  increasing) and sum to 1 − a. The code hard-codes K = 4 (options A–D): its "+ 3" is K − 1 here, which keeps
  the sum at 1 − a for any K; ln 3 is kept as the code's constant (tanh(ln 3) = 0.8 is where the second-largest
  probability lands when a = 0).
- ``"proportional"``: t_j = (1 − a)·s_j / Σ_j s_j, the non-maximum probabilities scaled to sum to 1 − a (order
  kept) — a reconstruction from the paper summary's formula alone, made before the code was read; kept for comparison.
- ``"uniform"``: t_j = (1 − a)/(K − 1), this project's earlier rule (before it followed the CFT code).

Where this implementation differs from the CFT code, on purpose: the step's batch is the whole optimizer step
(every micro-batch of every process, ``CALMTrainer``'s unit), where the code's Trainer averages the per-device
micro-batch terms (so with accumulation or several processes our term is (accumulation × processes) times the
code's; divide ``cft_coefficient`` by that to match); a bin that was empty in the pass has accuracy = its centre
and count 1 (the code's accuracy is 0 there and it divides by a count of 0); bins are the library's equal-width
bins (``hf_calibration.metrics.binning.uniform_bin_index``: confidence 1.0 in the last bin, where the code leaves
it out of the term).
"""

from __future__ import annotations

import math

import torch

from hf_calibration.errors import check_choice

CFT_TARGETS = ("tanh", "proportional", "uniform")
CFT_NORMALIZATIONS = ("bin_count", "batch_mean")


def non_max_target(non_max: torch.Tensor, accuracy: torch.Tensor, rule: str = "tanh") -> torch.Tensor:
    """Targets (N, K − 1) of the non-maximum probabilities ``non_max`` (N, K − 1), sorted in descending order
    along dim 1, for items whose bins have accuracy ``accuracy`` (N,) in [0, 1] (module docstring: 'tanh',
    'proportional' or 'uniform'). Each row sums to 1 − accuracy; 'tanh' and 'proportional' keep the order of
    ``non_max`` (not strictly for 'tanh' where tanh saturates). Differentiable w.r.t. ``non_max`` (not detached,
    as in the CFT code). Raises ValueError for an unknown rule."""
    check_choice(rule, "cft_target", CFT_TARGETS)
    remaining = (1 - accuracy).to(non_max.dtype)[:, None]
    if rule == "uniform":
        return (remaining / non_max.shape[1]).expand_as(non_max)
    tiny = torch.finfo(non_max.dtype).tiny
    if rule == "proportional":
        return remaining * non_max / non_max.sum(dim=1, keepdim=True).clamp(min=tiny)
    # γ·s_j written as ln 3/(1 − a) · s_j/s_1, finite for a < 1 and s_1 > 0 (s_1 = 0 means every s_j = 0);
    # rows with a = 1 get the code's target 0 (A = 0), their γ replaced by a finite stand-in
    perfect = remaining <= 0
    scale = math.log(3) / torch.where(perfect, torch.ones_like(remaining), remaining)
    squashed = torch.tanh(scale * non_max / non_max[:, :1].clamp(min=tiny))
    weight = torch.where(perfect, torch.zeros_like(remaining),
                         remaining / (squashed.sum(dim=1, keepdim=True) + non_max.shape[1]))
    return weight * (squashed + 1)


def cft_item_errors(probs: torch.Tensor, accuracy: torch.Tensor, rule: str = "tanh") -> torch.Tensor:
    """(conf_i − acc_i)² + Σ_{j ≠ argmax} (p_ij − t_ij)² per item: (N,) from probabilities ``probs`` (N, K) and
    the accuracy of each item's bin ``accuracy`` (N,). Differentiable w.r.t. ``probs``."""
    ordered = probs.sort(dim=1, descending=True).values
    conf, non_max = ordered[:, 0], ordered[:, 1:]
    acc = accuracy.to(probs.dtype)
    return (conf - acc) ** 2 + ((non_max - non_max_target(non_max, acc, rule)) ** 2).sum(dim=1)


def cft_term(probs: torch.Tensor, bins: torch.Tensor, bin_accuracy: torch.Tensor, bin_count: torch.Tensor, *,
             rule: str = "tanh", normalization: str = "bin_count", items: int = 1) -> torch.Tensor:
    """This batch's share of the step's CFT term (0-d tensor in ``probs``' dtype).

    Parameters
    ----------
    probs : (N, K) probabilities of the batch's items.  bins : (N,) int64, each item's confidence bin.
    bin_accuracy, bin_count : (B,) accuracy and number of items of each bin in the pass over the training data.
    rule : the non-maximum target (``non_max_target``).
    normalization : 'bin_count' → Σ_i errors_i / max(N_{bin i}, 1) (the CFT code; an empty bin counts 1);
        'batch_mean' → Σ_i errors_i / ``items``, the step's item count (this project's earlier rule).

    Raises ValueError for an unknown normalization.
    """
    check_choice(normalization, "cft_normalization", CFT_NORMALIZATIONS)
    errors = cft_item_errors(probs, bin_accuracy.to(probs.device)[bins], rule)
    if normalization == "bin_count":
        return (errors / bin_count.to(probs.device, probs.dtype)[bins].clamp(min=1)).sum()
    return errors.sum() / items
