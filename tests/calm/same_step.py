"""Shared by the gradient-accumulation and multi-process tests: data with unequal completion lengths, the
method cases, and the float32 tolerance for "the same SGD step computed with sums grouped differently".

Every term of every method is normalised over the whole optimizer step (all micro-batches, all processes):
the item is the scored position, i.e. the answer letter (one per example) with entropy_domain='options' and
every completion token with entropy_domain='vocab'. The optimizer in these tests is plain SGD without clipping,
so the step is w' = w − lr·g and a difference in g is not hidden by Adam's sign-like first step.
"""

WORDS = "the a of and to in is was for on that with as by it at from this be are".split()
U = 2.0**-24  # float32 unit roundoff
# Completion lengths in words; TRL appends EOS, so 2, 12, 6 and 4 tokens.
COMPLETION_WORDS = (1, 11, 5, 3)
# (id, method, CALMConfig overrides, optimizer steps). iterate moves θ on even steps and α on odd ones: its α step
# is checked at step 2 with learning_rate=0, so θ is exactly the initial θ at step 2 in both runs.
CASES = [
    ("sft", "sft", {}, 1),
    ("label_smoothing", "sft", {"label_smoothing_factor": 0.1}, 1),
    ("cft", "cft", {}, 1),
    # the CFT term alone at full scale (the default c = 1e-3 leaves it a 1e-3 share of the step above): per-bin
    # training-set counts with the code's tanh target, and this project's earlier rule (uniform, batch mean)
    ("cft_term", "cft", {"cft_weight": 1.0, "cft_coefficient": 1.0}, 1),
    ("cft_term_batch_mean", "cft", {"cft_weight": 1.0, "cft_coefficient": 1.0, "cft_target": "uniform",
                                    "cft_normalization": "batch_mean"}, 1),
    ("regularization", "regularization", {}, 1),
    ("bome", "bome", {}, 1),
    ("bome_T2_eta_value", "bome", {"inner_steps": 2, "phi_rule": "eta_value"}, 1),
    ("scalar", "scalar", {}, 1),
    ("iterate_theta_step", "iterate", {}, 1),
    ("iterate_alpha_step", "iterate", {"learning_rate": 0.0}, 2),
]
SGD = dict(optim="sgd", max_grad_norm=0.0, lr_scheduler_type="constant", learning_rate=1.0, alpha_learning_rate=1.0)


def vocab_data(n=3):
    """Open-ended prompt/completion rows (train = calibration) whose completions have unequal lengths."""
    from datasets import Dataset

    rows = [{"prompt": f"which option is correct ? {WORDS[i]}", "completion": " " + " ".join(WORDS[i:i + k])}
            for i, k in enumerate(COMPLETION_WORDS[:n])]
    data = Dataset.from_list(rows)
    return data, data


def options_data(tok, n=3):
    """MCQA rows as prompt/completion (the gold letter) and the prompt-only calibration rows."""
    from datasets import Dataset

    from hf_calibration.calm import mcqa_to_prompt_completion

    rows = [{"question": f"which option is correct ? {w}", "choices": ["the", "a", "of", "and"], "answer": i % 4,
             "subject": "x", "source": "tiny"} for i, w in enumerate(WORDS[:n])]
    data = mcqa_to_prompt_completion(Dataset.from_list(rows), tok)
    return data, data.remove_columns("completion")


def positions(trainer) -> int:
    """Token positions of the whole S_T and S_V data: the longest sum a gradient entry is reduced over."""
    n = sum(len(r) for r in trainer.train_dataset["input_ids"])
    if trainer.calibration_dataset is not None:
        n += sum(len(r) for r in trainer.calibration_dataset["input_ids"])
    return n


def assert_same_step(before, after, reference, lr, n):
    """``after`` equals ``reference`` (two runs of the same SGD step from ``before``) to float32 reordering error.

    Tolerance, per tensor: lr·(4·n·u)·G + 2·u·max|w'|, with u = 2^-24 the float32 unit roundoff. The two runs
    compute the same gradient with the sums over the n token positions (S_T and S_V together) grouped differently
    (micro-batches or processes against one batch) and the matrices padded to different lengths. A float32 sum of
    n terms in another order moves by at most about (n − 1)·u times the sum of their magnitudes; that sum is taken
    as n·u·G with G = max|g| over all parameters of the reference step (the gradient's scale: at initialisation the
    terms are of that order, without large cancellation), times 4 for the chain of such reductions a gradient
    passes through (logits, softmax, the α/θ products, the final sum over positions). Then each run rounds
    w − lr·g once: u·|w'| each. With n ≈ 100 the first term is ≈ 2.4e-5·lr·G, three orders of magnitude below
    what a per-micro-batch mean does to these data (0.09–1.2·lr·G).
    """
    g_scale = max(float((reference[k] - before[k]).abs().max()) for k in reference) / lr
    assert g_scale > 0, "the step did not move the parameters"
    for k in reference:
        tol = lr * 4 * n * U * g_scale + 2 * U * float(reference[k].abs().max())
        diff = float((after[k] - reference[k]).abs().max())
        assert diff <= tol, f"{k}: max |Δ| {diff:.3g} > tolerance {tol:.3g} (step-relative {diff / (lr * g_scale):.3g})"
