"""Hand-made SECL stream records (the fields ``evaluation.stream.summarize_stream`` reads), shared by the tests of the
stream's paired differences and of the experiments' claim check."""

import numpy as np


def records(n=80, seed=0):
    """A stream of one domain: verbalized confidence overconfident and uninformative, SECL's informative."""
    rng = np.random.default_rng(seed)
    correct = rng.uniform(size=n) < 0.5
    out = []
    for i, c in enumerate(correct):
        secl = float(np.clip((0.9 if c else 0.1) + rng.normal(0, 0.05), 0.01, 0.99))
        out.append({
            "domain": "d", "n_options": 2, "correct": bool(c), "verbalized": float(rng.uniform(0.85, 0.99)),
            "p_true": 0.5, "norm_p_true": 0.5, "dinco": 0.5, "secl": secl, "secl_correct": bool(c),
            "burst": i < 20, "updated": i < 10, "skipped_by_bin_gate": 10 <= i < 20, "alarm": i == 0,
            "passes": {"verbalized": 3, "p_true": 2, "norm_p_true": 3, "dinco": 3, "secl": 4 if i < 20 else 3},
        })
    return out


def level_shift_stream(seed=0):
    """Two domains: "easy" (80 % right) and "hard" (20 % right). Verbalized ranks within each domain (right answers
    0.1 higher) but is more confident on "hard"; SECL ranks within no domain but is 0.3 lower on "hard": its pooled
    AUROC beats the verbalized one, its AUROC within each domain is 0.5."""
    rng = np.random.default_rng(seed)
    out = []
    for domain, acc, level, verbal_level in (("easy", 0.8, 0.8, 0.6), ("hard", 0.2, 0.5, 0.8)):
        for i in range(100):
            c = i < acc * 100
            verbal = verbal_level + (0.1 if c else 0.0) + rng.normal(0, 0.02)
            out.append({"domain": domain, "n_options": 2, "correct": bool(c), "verbalized": float(verbal),
                        "p_true": 0.5, "norm_p_true": 0.5, "dinco": 0.5, "secl": level, "secl_correct": bool(c),
                        "burst": False, "updated": False, "skipped_by_bin_gate": False, "alarm": False,
                        "passes": {"verbalized": 3, "p_true": 2, "norm_p_true": 3, "dinco": 3, "secl": 3}})
    return out
