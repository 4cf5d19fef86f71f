"""What ``CALMTrainer`` reports besides its losses: the letter metrics at evaluation and the model card's CALM
section."""

from __future__ import annotations

import json

import numpy as np

# the CALMConfig fields a model card records
CARD_FIELDS = ("method", "inner_steps", "inner_learning_rate", "eta", "phi_rule", "bome_epsilon", "bome_optimizer",
               "upper_gradient", "bome_momentum", "max_grad_norm", "cft_weight", "cft_coefficient", "cft_target", "cft_normalization",
               "cft_num_bins", "cft_refresh_steps", "alpha_learning_rate",
               "alpha_weight_decay", "adjustment_mode", "temperature_parameterization", "adjustment_tokens",
               "entropy_domain", "num_options", "regularization_beta", "label_smoothing_factor", "learning_rate",
               "max_steps", "num_train_epochs", "per_device_train_batch_size", "seed")


def calibration_metrics(prediction, n_bins: int) -> dict:
    """``compute_metrics`` of a letter evaluation: ``prediction.predictions`` (n, K) letter probabilities,
    ``prediction.label_ids`` (n,) gold letters → accuracy, mean confidence, conf-ECE and cw-ECE (``n_bins``
    equal-width bins) and NLL, as floats."""
    from hf_calibration.metrics import classwise_ece, expected_calibration_error, negative_log_likelihood

    probs = np.asarray(prediction.predictions, dtype=np.float64)
    labels = np.asarray(prediction.label_ids).astype(int)
    return {
        "accuracy": float((probs.argmax(1) == labels).mean()),
        "mean_confidence": float(probs.max(1).mean()),
        "conf_ece": float(expected_calibration_error(labels, probs, n_bins=n_bins)),
        "cw_ece": float(classwise_ece(labels, probs, n_bins=n_bins)),
        "nll": float(negative_log_likelihood(labels, probs)),
    }


def model_card_section(args, log_history) -> str:
    """The Markdown appended to TRL's model card: how to load the adjustment, the CALM config (``CARD_FIELDS`` of
    ``args``) and the last evaluation in ``log_history`` (the Trainer's), if any."""
    config = {k: getattr(args, k) for k in CARD_FIELDS}
    evals = [e for e in log_history if "eval_loss" in e]
    lines = [
        "", "## CALM calibration", "",
        f"Trained with `hf_calibration.calm.CALMTrainer`, method `{args.method}` (CALM = 'bome'; paper: "
        "[arXiv 2608.07419](https://arxiv.org/abs/2608.07419)). The logit adjustment is in "
        "`logit_adjustment.safetensors` / `logit_adjustment_config.json`; load with "
        "`hf_calibration.calm.CALMModel.from_pretrained(folder)`.", "",
        "Config:", "", "```json", json.dumps(config, indent=2, default=str), "```", "",
    ]
    if evals:
        lines += ["Last evaluation:", "", "```json", json.dumps(evals[-1], indent=2, default=str), "```", ""]
    return "\n".join(lines)
