"""Can SECL's verbalized read learn what its teacher knows? The offline ceiling, and a linear probe.

    python -m experiments.secl_learnability --model smollm2 --output-dir outputs/secl_learnability_smollm2

With answers and teacher fixed (adapter scope "confidence": the answers, P(True)Norm c* and the gold
correctness do not depend on the adapter), every item of one domain (default: length-matched HaluEval QA,
gold letters balanced) is scored once and saved, item by item, to ``items.jsonl`` in ``--output-dir`` (a
restart reads back what is there and scores the rest). Then ``--n-test`` items (seeded) are held out and the
SECL adapter (``hf_calibration.secl``, identity at the start, the same LoRA layout as the stream's) is trained
**offline** on the first N of the others (nested: the N = 25 set is in the N = 50 set …): unclipped MSE of the
verbalized confidence to the target (c*, or the gold 0/1 as the supervised ceiling), minibatches of
``--batch-size``, ``--epochs`` epochs, AdamW at ``--lr`` (``secl.replay.minibatch_step``, the update step the
stream's replay uses). Each trained adapter is read on its training set and on the held-out set: AUROC, ECE
(15 equal-width bins) and Brier with 95 % bootstrap intervals (``metrics.calibration_report``), beside the base
verbalized confidence, the teacher c* and the constant-accuracy reference (confidence = accuracy of the training
set, on every held-out item). Variants at the largest N: the answer restated as "A. <option text>"
(``SECLConfig.restate``), LoRA on every linear module with a higher rank, scope "all" (the adapter on the
whole conversation; answers and teacher stay fixed), each also with the option text, and a longer, larger-step
fit (``LONG``: epochs and learning rate; is the read under-fitted by the optimiser or by what it can express?),
a sharper teacher (``SHARP_TAU_N``: c* recomputed at a smaller τ_n from the saved P(True) of every option, so
that its spread, not its level, dominates the squared error), and the KL loss (``_kl``:
``SECLConfig.confidence_loss`` "kl", the read's distribution over 0..10 against a two-point target, whose gradient
stays at saturation). Each result is one line of ``results.jsonl``; a restart skips those done.

Linear probe: scikit-learn's ``LogisticRegressionCV`` (standardised features, 5-fold CV over C) on the base
model's hidden state at the position where the confidence is read (the token after the follow-up turn) — with
the bare decoded answer, with the option text — and at the teacher's P(True) read, fitted on the training pool
and scored on the held-out items, per layer (middle, three quarters, last): is the correctness there at all?

Writes ``items.jsonl``, ``results.jsonl``, ``probe.json`` and ``report.md`` (every table).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

MODEL_ALIASES = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct", "qwen": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
                 "qwen15": "Qwen/Qwen2.5-Coder-1.5B-Instruct"}
CONFIDENCE_POSITIONS = ("verbalized_answer", "verbalized_option_text", "p_true_option_text")


# -- scoring every item once -----------------------------------------------------------------------
def _hidden_at_end(secl, context, cont, layers):
    """Hidden states (one list per layer in ``layers``) at the last token of ``cont`` run on ``context``."""
    from hf_calibration.modeling.cache import repeat_cache

    cache, mask, cached = context
    tokens = cont[cached:]
    ids = torch.as_tensor([tokens], dtype=torch.long)
    full = torch.cat([mask, torch.ones(len(tokens), dtype=torch.long)])[None]
    positions = (int(mask.sum()) + torch.arange(len(tokens)))[None]
    with torch.no_grad():
        out = secl(input_ids=ids, attention_mask=full, position_ids=positions, cache=repeat_cache(cache, 1),
                   use_cache=True, logits_to_keep=1, output_hidden_states=True)
    return [[round(float(v), 5) for v in out.hidden_states[layer][0, -1]] for layer in layers]


def probe_layers(num_layers: int) -> list[int]:
    """Hidden-state indices the probe reads (0 = embeddings): the middle, three quarters and the last layer."""
    return sorted({num_layers // 2, (3 * num_layers) // 4, num_layers})


def score_item(secl, item, *, max_new_tokens: int, layers) -> dict:
    """One item with the identity adapter: answer, correctness, verbalized confidence restating the decoded answer
    and the option text, P(True) of every option and c*, and the probe's hidden states."""
    from hf_calibration.secl.confidence import PLAIN_CONFIDENCE_PREFIX, PLAIN_P_TRUE_PREFIX, cache_row
    from hf_calibration.modeling.streams import judge

    start = time.perf_counter()
    ids = torch.tensor([item.prompt_ids])
    out = secl.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                        return_dict_in_generate=True, secl_choices=[item.choices], secl_update=False,
                        pad_token_id=secl.secl_tokenizer.pad_token_id)
    answer = out.sequences[0, len(item.prompt_ids):].tolist()
    stop = secl.secl_stop_ids()
    answer = answer[: next((j for j, t in enumerate(answer) if t in stop), len(answer))]
    text = secl.secl_tokenizer.decode(answer, skip_special_tokens=True)
    label = secl.secl_pseudo_label(item.prompt_ids, answer, choices=item.choices, prompt_cache=out.cache)
    own = secl.secl_answer_text(answer)
    option_text = secl.secl_option(own, item.choices)[1]
    # generate's cache holds the prompt and every answer token but the last: extended, not run again
    keep = min(out.cache.get_seq_length(), len(item.prompt_ids) + len(answer))
    context = secl.secl_answer_context(item.prompt_ids, answer, (
        cache_row(out.cache, 0, keep), torch.ones(keep, dtype=torch.long), keep - len(item.prompt_ids)))
    with torch.no_grad():
        verbal_text = float(secl.secl_verbalized(item.prompt_ids, answer, context=context, restated=option_text)[0])
    cfg = secl.secl_config
    conts = {"verbalized_answer": secl.secl_followup(answer, own, cfg.confidence_template, PLAIN_CONFIDENCE_PREFIX),
             "verbalized_option_text": secl.secl_followup(answer, option_text, cfg.confidence_template,
                                                       PLAIN_CONFIDENCE_PREFIX),
             "p_true_option_text": secl.secl_followup(answer, option_text, cfg.p_true_template, PLAIN_P_TRUE_PREFIX)}
    hidden = {k: _hidden_at_end(secl, context, c, layers) for k, c in conts.items()}
    return {"answer_ids": answer, "text": text, "option_text": option_text, "correct": bool(judge(item, text)[1]),
            "verbalized": float(secl.secl_records[0].confidence), "verbalized_option_text": verbal_text,
            "norm_p_true": label["norm_p_true"], "p_true_options": [float(v) for v in label["p_true"]],
            "hidden": hidden, "seconds": time.perf_counter() - start}


def score_items(secl, items, path: Path, *, max_new_tokens: int, layers, progress: bool = True) -> list[dict]:
    """Every item scored once, saved line by line to ``path``; the lines already there are read back."""
    from tqdm.auto import tqdm

    done = {}
    if path.exists():
        lines = path.read_text(encoding="utf-8").splitlines()
        for k, line in enumerate(lines):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if k < len(lines) - 1:
                    raise
                # a line cut by a stopped run: drop it, the item is scored again
                path.write_text("".join(x + "\n" for x in lines[:k]), encoding="utf-8")
                break
            done[row["index"]] = row
    with path.open("a", encoding="utf-8") as f:
        for i, item in enumerate(tqdm(items, desc="scoring", disable=not progress, unit="q")):
            if i in done:
                continue
            row = {"index": i, **score_item(secl, item, max_new_tokens=max_new_tokens, layers=layers)}
            f.write(json.dumps(row) + "\n")
            f.flush()
            done[i] = row
    return [done[i] for i in range(len(items))]


# -- offline training ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Variant:
    """One trained adapter: ``n`` training items, the target ("teacher" = c*, "gold" = 0/1 correctness), what the
    confidence turn restates, the LoRA layout and the adapter scope."""

    n: int
    target: str = "teacher"
    restate: str = "answer"
    lora: str = "default"  # "default": the stream's (r 8, q/v of the upper half); "all_linear": every linear, r 32
    scope: str = "confidence"
    epochs: int = 0  # 0: the run's --epochs
    lr: float = 0.0  # 0: the run's --lr
    tau_n: float = 0.0  # the teacher's τ_n; 0: c* as scored (at SCORED_TAU_N)
    loss: str = "mse"  # SECLConfig.confidence_loss: "mse", or "kl" to the two-point target distribution

    @property
    def name(self) -> str:
        extra = [x for x, default in ((self.restate, "answer"), (self.lora, "default"),
                                      (f"scope_{self.scope}", "scope_confidence"), (f"e{self.epochs}", "e0"),
                                      (f"lr{self.lr:g}", "lr0"), (f"tau{self.tau_n:g}", "tau0"),
                                      (self.loss, "mse")) if x != default]
        return "_".join([f"n{self.n}", self.target, *extra])


LONG = (10, 5e-3)  # the "_long" variants' epochs and learning rate: twice the steps, five times the step size
SHARP_TAU_N = 0.05  # the "_sharp" variants' teacher: c* spread over [0, 1] (SmolLM2 QA-LM: sd 0.24, at 0.2 0.08)
EXTRA_VARIANTS = ("option_text_gold", "all_linear", "scope_all", "option_text_all_linear", "option_text_scope_all",
                  "option_text_long", "option_text_gold_long", "option_text_sharp", "option_text_sharp_long",
                  "option_text_kl", "option_text_long_kl")
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


SCORED_TAU_N = 0.2  # the τ_n the items were scored at: SECLConfig's default when the study ran


def secl_config_for(variant: Variant, num_layers: int):
    from hf_calibration.secl.config import SECLConfig

    if variant.lora == "all_linear":
        return SECLConfig(adapter_scope=variant.scope, restate=variant.restate, target_modules=ALL_LINEAR,
                          target_layers=list(range(num_layers)), lora_r=32, lora_alpha=64, tau_n=SCORED_TAU_N)
    return SECLConfig(adapter_scope=variant.scope, restate=variant.restate, tau_n=SCORED_TAU_N)


def teacher_targets(rows, indices, tau_n: float) -> list[float]:
    """c* of ``indices``: as scored (``tau_n`` 0) or P(True)Norm recomputed at ``tau_n`` from the saved P(True) of
    every candidate (``secl.confidence.norm_p_true``; a smaller τ_n spreads c* without reordering 2-option items)."""
    from hf_calibration.secl.confidence import norm_p_true

    if not tau_n:
        return [rows[i]["norm_p_true"] for i in indices]
    return [float(norm_p_true(np.array([rows[i]["p_true_options"]]), tau=tau_n)[0, 0]) for i in indices]


def replay_items(secl, items, rows, indices, *, target: str, contexts: dict, tau_n: float = 0.0) -> list:
    """``ReplayItem``s of ``indices`` with fixed targets (c* at ``tau_n``, or gold) and, in the "confidence" scope,
    their answer caches (computed once with the adapter off and kept in ``contexts``)."""
    from hf_calibration.secl.replay import ReplayItem

    c_star = dict(zip(indices, teacher_targets(rows, indices, tau_n)))

    out = []
    for i in indices:
        row = rows[i]
        context = None
        if secl.secl_config.adapter_scope == "confidence":
            if i not in contexts:
                contexts[i] = secl.secl_answer_context(items[i].prompt_ids, row["answer_ids"])
            context = contexts[i]
        restated = row["option_text"] if secl.secl_config.restate == "option_text" else secl.secl_answer_text(
            row["answer_ids"])
        goal = c_star[i] if target == "teacher" else float(row["correct"])
        out.append(ReplayItem(items[i].prompt_ids, row["answer_ids"], restated, c_star[i], context, i, goal))
    return out


def train_offline(secl, train, *, epochs: int, batch_size: int, lr: float, seed: int, loss: str = "mse") -> dict:
    """AdamW on the adapter, ``epochs`` passes over ``train`` (``ReplayItem``s) in seeded random minibatches, on
    ``loss`` (``SECLConfig.confidence_loss``). Returns {"steps", "loss_per_epoch", "seconds"}."""
    from hf_calibration.secl.replay import minibatch_step

    opt = torch.optim.AdamW(secl.secl_adapter_params(), lr=lr, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    start, steps, losses = time.perf_counter(), 0, []
    secl.train()
    for _ in range(epochs):
        order, total = rng.permutation(len(train)), 0.0
        for b in range(0, len(train), batch_size):
            batch = [train[j] for j in order[b: b + batch_size]]
            value, _ = minibatch_step(secl, batch, opt, alpha_step=1.0, delta=1.0, loss=loss)
            total += value * len(batch)
            steps += 1
        losses.append(total / len(train))
    secl.eval()
    return {"steps": steps, "loss_per_epoch": losses, "seconds": time.perf_counter() - start}


def read_confidences(secl, batch) -> np.ndarray:
    from hf_calibration.secl.replay import item_confidence

    with torch.no_grad():
        return np.array([float(item_confidence(secl, item)[0][0]) for item in batch])


# -- metrics ---------------------------------------------------------------------------------------
METRICS = ("auroc", "conf_ece", "brier")


def metric_row(correct, conf, *, n_resamples: int, seed: int) -> dict:
    """AUROC, ECE (15 equal-width bins) and Brier of ``conf`` against ``correct``, each {value, low, high}."""
    from hf_calibration.metrics import calibration_report

    report = calibration_report(np.asarray(correct, dtype=int), np.clip(np.asarray(conf, dtype=float), 0, 1),
                                n_bins=15, n_resamples=n_resamples, seed=seed)
    return {m: report[m] for m in METRICS} | {"accuracy": report["accuracy"]["value"], "n": report["n"]}


def paired_difference(metric, correct, a, b, *, n_resamples: int, seed: int) -> dict:
    """Paired bootstrap of metric(a) − metric(b) on the same items (e.g. ``confidence_auroc``), {value, low, high}."""
    from hf_calibration.metrics import paired_bootstrap

    y = np.asarray(correct, dtype=int)
    r = paired_bootstrap(metric, y, np.asarray(a, float), y, np.asarray(b, float), n_resamples=n_resamples, seed=seed)
    return {"value": r[0], "low": r[1], "high": r[2]}


def references(rows, train_idx, test_idx, *, n_resamples: int, seed: int) -> dict:
    """The untrained signals on the held-out items: verbalized (both restatements), the teacher c*, and the
    constant-accuracy reference (the accuracy of the largest training set)."""
    y = [rows[i]["correct"] for i in test_idx]
    const = float(np.mean([rows[i]["correct"] for i in train_idx]))
    signals = {"verbalized": [rows[i]["verbalized"] for i in test_idx],
               "verbalized_option_text": [rows[i]["verbalized_option_text"] for i in test_idx],
               "teacher_norm_p_true": [rows[i]["norm_p_true"] for i in test_idx],
               "constant_accuracy": [const] * len(test_idx)}
    return {k: metric_row(y, v, n_resamples=n_resamples, seed=seed) for k, v in signals.items()} | {
        "constant_value": const}


def run_variant(secl, variant: Variant, items, rows, pool, test_idx, contexts, args) -> dict:
    """Train one variant from the identity adapter and read it on its training set and the held-out set."""
    from hf_calibration.metrics import confidence_auroc

    secl.reset_calibration()
    train_idx = pool[: variant.n]
    train = replay_items(secl, items, rows, train_idx, target=variant.target, contexts=contexts, tau_n=variant.tau_n)
    test = replay_items(secl, items, rows, test_idx, target=variant.target, contexts=contexts, tau_n=variant.tau_n)
    fit = train_offline(secl, train, epochs=variant.epochs or args.epochs, batch_size=args.batch_size,
                        lr=variant.lr or args.lr, seed=args.seed, loss=variant.loss)
    start = time.perf_counter()
    conf_train, conf_test = read_confidences(secl, train), read_confidences(secl, test)
    y_train, y_test = [rows[i]["correct"] for i in train_idx], [rows[i]["correct"] for i in test_idx]
    base = "verbalized_option_text" if variant.restate == "option_text" else "verbalized"
    kw = dict(n_resamples=args.n_resamples, seed=args.seed)
    constant = [float(np.mean(y_train))] * len(test_idx)  # the constant-accuracy reference of this training set
    return {"variant": variant.name, **dataclasses.asdict(variant), **fit, "read_seconds": time.perf_counter() - start,
            "constant_test": metric_row(y_test, constant, **kw),
            "train": metric_row(y_train, conf_train, **kw), "test": metric_row(y_test, conf_test, **kw),
            "delta_auroc_vs_base": paired_difference(confidence_auroc, y_test, conf_test, [rows[i][base] for i in test_idx], **kw),
            "test_confidences": [round(float(c), 5) for c in conf_test]}


# -- the linear probe ------------------------------------------------------------------------------
def linear_probe(rows, train_idx, test_idx, layers, *, n_resamples: int, seed: int) -> dict:
    """Per position and layer: ``LogisticRegressionCV`` on the standardised hidden state, fitted on the training
    pool, read on the held-out items (its predicted probability as the confidence)."""
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    y_train = np.array([rows[i]["correct"] for i in train_idx], dtype=int)
    y_test = np.array([rows[i]["correct"] for i in test_idx], dtype=int)
    out = {}
    if len(set(y_train)) < 2 or np.bincount(y_train).min() < 2:
        return out  # too few of one class to cross-validate
    folds = int(min(5, np.bincount(y_train).min()))
    for position in CONFIDENCE_POSITIONS:
        for j, layer in enumerate(layers):
            x_train = np.array([rows[i]["hidden"][position][j] for i in train_idx])
            x_test = np.array([rows[i]["hidden"][position][j] for i in test_idx])
            model = make_pipeline(StandardScaler(), LogisticRegressionCV(
                Cs=10, cv=folds, l1_ratios=(0.0,), scoring="neg_log_loss", max_iter=5000, use_legacy_attributes=False))
            model.fit(x_train, y_train)
            prob = model.predict_proba(x_test)[:, 1]
            out[f"{position}@{layer}"] = metric_row(y_test, prob, n_resamples=n_resamples, seed=seed)
    return out


# -- the report ------------------------------------------------------------------------------------
def format_interval(m: dict) -> str:
    """"value [low, high]" to 3 decimals; "n/a" for NaN (one class only)."""
    if m["value"] != m["value"]:
        return "n/a"
    return f"{m['value']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"


def format_report(refs: dict, results: list[dict], probe: dict, meta: dict) -> str:
    lines = [f"# SECL learnability: {meta['model']} on {meta['dataset']}", "",
             f"{meta['n_items']} items, {meta['n_test']} held out (seed {meta['seed']}), training pool "
             f"{meta['n_pool']}; epochs {meta['epochs']}, batch {meta['batch_size']}, lr {meta['lr']:g}; "
             f"accuracy on the held-out items {refs['verbalized']['accuracy']:.3f}; constant-accuracy "
             f"reference {refs['constant_value']:.3f} (accuracy of the training pool).", "",
             "## References on the held-out items (untrained)", "",
             "| signal | AUROC | ECE | Brier |", "|---|---|---|---|"]
    for name, m in refs.items():
        if isinstance(m, dict):
            lines.append(f"| {name} | {format_interval(m['auroc'])} | {format_interval(m['conf_ece'])} | {format_interval(m['brier'])} |")
    lines += ["", "## Offline training of the SECL adapter", "",
              "| variant | N | target | held-out AUROC | held-out ECE | held-out Brier | train AUROC | train ECE | "
              "const. acc. ECE / Brier | ΔAUROC vs base verbalized [95 %] | steps | train s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['variant']} | {r['n']} | {r['target']} | {format_interval(r['test']['auroc'])} | "
                     f"{format_interval(r['test']['conf_ece'])} | {format_interval(r['test']['brier'])} | {format_interval(r['train']['auroc'])} | "
                     f"{format_interval(r['train']['conf_ece'])} | {r['constant_test']['conf_ece']['value']:.3f} / "
                     f"{r['constant_test']['brier']['value']:.4f} | {format_interval(r['delta_auroc_vs_base'])} | {r['steps']} | "
                     f"{r['seconds']:.0f} |")
    lines += ["", "## Linear probe (LogisticRegressionCV on the base model's hidden state, held-out items)", "",
              "| position @ hidden-state index | AUROC | ECE | Brier |", "|---|---|---|---|"]
    for name, m in probe.items():
        lines.append(f"| {name} | {format_interval(m['auroc'])} | {format_interval(m['conf_ece'])} | {format_interval(m['brier'])} |")
    return "\n".join(lines) + "\n"


# -- the command -----------------------------------------------------------------------------------
def variants_for(args, pool_size: int) -> list[Variant]:
    """Every N then the variants at the largest N, most informative first (a stopped run has those)."""
    sizes = sorted({min(n, pool_size) for n in args.sizes})
    top = sizes[-1]
    order = [Variant(top, "teacher"), Variant(top, "gold"), Variant(top, "teacher", restate="option_text")]
    order += [Variant(n, t, restate=args.sweep_restate) for t in ("teacher", "gold") for n in sizes[:-1]]
    extra = {"option_text_gold": Variant(top, "gold", restate="option_text"),
             "all_linear": Variant(top, "teacher", lora="all_linear"),
             "scope_all": Variant(top, "teacher", scope="all"),
             "option_text_all_linear": Variant(top, "teacher", restate="option_text", lora="all_linear"),
             "option_text_scope_all": Variant(top, "teacher", restate="option_text", scope="all"),
             "option_text_long": Variant(top, "teacher", restate="option_text", epochs=LONG[0], lr=LONG[1]),
             "option_text_gold_long": Variant(top, "gold", restate="option_text", epochs=LONG[0], lr=LONG[1]),
             "option_text_sharp": Variant(top, "teacher", restate="option_text", tau_n=SHARP_TAU_N),
             "option_text_sharp_long": Variant(top, "teacher", restate="option_text", tau_n=SHARP_TAU_N,
                                               epochs=LONG[0], lr=LONG[1]),
             "option_text_kl": Variant(top, "teacher", restate="option_text", loss="kl"),
             "option_text_long_kl": Variant(top, "teacher", restate="option_text", epochs=LONG[0], lr=LONG[1],
                                            loss="kl")}
    order += [extra[v] for v in args.variants]
    return list(dict.fromkeys(order))


def parse_args(argv=None):
    from hf_calibration.cli import script_parser

    ap = script_parser("python -m experiments.secl_learnability", __doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="an alias (smollm2, qwen), a Hub id or a local folder")
    ap.add_argument("--dataset", default="halueval_qa_lm", help="one MCQA domain of the stream (modeling.streams)")
    ap.add_argument("--limit", type=int, default=None, help="items of the domain (default: all)")
    ap.add_argument("--n-test", type=int, default=200, help="held-out items")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[25, 50, 100, 200],
                    help="training-set sizes N (capped at the training pool)")
    ap.add_argument("--variants", type=lambda s: [x for x in s.split(",") if x], default=["all_linear", "scope_all"],
                    help="extra variants at the largest N: " + ", ".join(EXTRA_VARIANTS))
    ap.add_argument("--sweep-restate", choices=("answer", "option_text"), default="answer",
                    help="what the confidence turn restates in the variants at the smaller N")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-resamples", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-probe", action="store_true")
    ap.add_argument("--only", type=lambda s: [x for x in s.split(",") if x], default=None,
                    help="train only these variants (names as in the report, e.g. n100_gold), so that two processes "
                         "can share one output folder once every item is scored; the report lists all done")
    ap.add_argument("--output-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    bad = [(k, v) for k, v in (("n_test", args.n_test), ("epochs", args.epochs), ("batch_size", args.batch_size))
           if v < 1] + [("sizes", n) for n in args.sizes if n < 1]
    unknown = [v for v in args.variants if v not in EXTRA_VARIANTS]
    if bad or unknown:
        ap.error(f"bad value: {(bad or [('variants', unknown)])[0]}")
    return args


def _load(args):
    from hf_calibration.modeling import load_model
    from hf_calibration.modeling.streams import build_stream

    model, tokenizer = load_model(MODEL_ALIASES.get(args.model, args.model))
    items = build_stream(tokenizer, args.dataset, limit_per_domain=args.limit or 10**6, seed=args.seed,
                         balance_gold=True)
    return model, tokenizer, items


def main(argv=None) -> dict:
    from hf_calibration.secl.mixin import apply_secl

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    model, tokenizer, items = _load(args)
    num_layers = model.config.num_hidden_layers
    layers = probe_layers(num_layers)
    if args.n_test >= len(items):
        raise SystemExit(f"--n-test: {args.n_test} leaves no training items of the {len(items)}")
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    secl = apply_secl(model, tokenizer, secl_config_for(Variant(1), num_layers))
    rows = score_items(secl, items, args.output_dir / "items.jsonl", max_new_tokens=args.max_new_tokens,
                       layers=layers)
    scoring_seconds = time.perf_counter() - start
    order = np.random.default_rng(args.seed).permutation(len(items)).tolist()
    test_idx, pool = order[: args.n_test], order[args.n_test:]
    refs = references(rows, pool, test_idx, n_resamples=args.n_resamples, seed=args.seed)
    probe = {} if args.no_probe else linear_probe(rows, pool, test_idx, layers, n_resamples=args.n_resamples,
                                                  seed=args.seed)
    (args.output_dir / "probe.json").write_text(json.dumps(probe, indent=1) + "\n", encoding="utf-8")
    results_path, contexts = args.output_dir / "results.jsonl", {}
    meta = {"model": args.model, "dataset": args.dataset, "n_items": len(items), "n_test": len(test_idx),
            "n_pool": len(pool), "seed": args.seed, "epochs": args.epochs, "batch_size": args.batch_size,
            "lr": args.lr, "scoring_seconds_this_run": scoring_seconds}
    for variant in variants_for(args, len(pool)):
        results = read_results(results_path)  # read again: another process may share the folder
        if variant.name in {r["variant"] for r in results} or (args.only and variant.name not in args.only):
            continue
        if variant.lora != "default" or variant.scope != "confidence":
            secl = _fresh_secl(args, variant, num_layers)
        elif secl.secl_config != secl_config_for(variant, num_layers):
            secl.set_secl_config(secl_config_for(variant, num_layers))
        result = run_variant(secl, variant, items, rows, pool, test_idx, contexts, args)
        with results_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(result) + "\n")
        (args.output_dir / "report.md").write_text(format_report(refs, results + [result], probe, meta),
                                                   encoding="utf-8")
    names = [v.name for v in variants_for(args, len(pool))]
    results = sorted(read_results(results_path), key=lambda r: names.index(r["variant"]) if r["variant"] in names
                     else len(names))
    (args.output_dir / "report.md").write_text(format_report(refs, results, probe, meta), encoding="utf-8")
    return {"references": refs, "results": results, "probe": probe, "meta": meta}


def read_results(path: Path) -> list[dict]:
    """The JSON lines of ``path`` ([] when it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _fresh_secl(args, variant: Variant, num_layers: int):
    """A SECL model with another LoRA layout or scope on a freshly loaded base model (the answers' caches are the
    base model's, so they stay valid)."""
    from hf_calibration.secl.mixin import apply_secl

    model, tokenizer, _ = _load(args)
    torch.manual_seed(args.seed)
    return apply_secl(model, tokenizer, secl_config_for(variant, num_layers))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
