"""``GatewayConfig``: what ``create_app`` needs (``hf-calibration serve`` adds the address to listen on)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hf_calibration.errors import ParameterError, check_choice, check_int, check_positive_number

SIGNALS = ("p_true", "norm_p_true", "verbalized", "option_probability", "secl", "none")
ADMIN_KEY_ENV = "HF_CALIBRATION_ADMIN_KEY"


@dataclass(kw_only=True)
class GatewayConfig:
    """Options of the calibration gateway (docs/gateway.md, "Flags"). Checked at construction: ParameterError naming
    the field and the value."""

    upstream: str = field(metadata={
        "help": "Base URL of the OpenAI-compatible model server the gateway forwards to, e.g. "
                "http://127.0.0.1:8000/v1 (vLLM: its prefix cache makes the confidence reads cheap)."})
    model: str = field(default="HuggingFaceTB/SmolLM2-135M-Instruct", metadata={
        "help": "Hub id or local folder of the served model: its tokenizer and chat template build the follow-up "
                "prompts sent upstream as token ids (offline: the packaged copies)."})
    served_model: str | None = field(default=None, metadata={
        "help": "Name the upstream serves the model under (when not given: --model)."})
    signal: str = field(default="p_true", metadata={
        "help": "The confidence signal given to every answer unless a request names another in calibration.signal: "
                "p_true, norm_p_true (needs calibration.options), verbalized, option_probability (multiple-choice "
                "requests), secl (the verbalized read through the stream's SECL adapter, see --secl), or none "
                "(pass-through only). diagnose on your own data says which ranks best "
                "(docs/gateway.md, 'Choosing the signal').", "choices": list(SIGNALS)})
    calibrator: str | None = field(default=None, metadata={
        "help": "A fit-posthoc output (platt, isotonic or histogram) fitted on --signal for --model, mapping the raw "
                "signal to the calibrated confidence; refused at start-up otherwise. Reloaded without a restart by "
                "POST /admin/reload or SIGHUP. When not given: the raw signal is the confidence."})
    abstain_risk: float | None = field(default=None, metadata={
        "help": "ALPHA in (0, 1): answer only above the confidence threshold chosen by Learn-then-Test on "
                "--abstain-calibration so that the error rate among answered questions is at most ALPHA with "
                "probability at least 1 - --abstain-delta (docs/methods.md); each choice then carries abstain. "
                "When not given: abstain is false."})
    abstain_delta: float = field(default=0.1, metadata={
        "help": "delta in (0, 1): the allowed probability that the risk of the chosen threshold exceeds ALPHA."})
    abstain_calibration: str | None = field(default=None, metadata={
        "help": "JSONL of labelled answers for --abstain-risk: 'correct' (true/false) and the raw signal under its "
                "name (diagnose's signals.jsonl) or under 'confidence'."})
    state_dir: str | None = field(default=None, metadata={
        "help": "Folder of the per-stream state and records (created; a gateway started on it resumes every "
                "stream). When not given: kept in memory only."})
    max_in_flight: int = field(default=64, metadata={
        "help": "Requests answered at once; later ones wait for a slot (up to --timeout)."})
    max_reads_in_flight: int = field(default=16, metadata={
        "help": "Confidence reads sent to the upstream at once."})
    timeout: float = field(default=600.0, metadata={
        "help": "Seconds an upstream request (and a wait for a slot) may take before the client gets a 504."})
    tau_n: float = field(default=0.2, metadata={"help": "P(True)Norm's temperature tau_n > 0 (docs/methods.md)."})
    admin_key: str | None = field(default=None, repr=False, metadata={
        "help": "Key of the admin endpoints (POST /admin/reload), sent as 'Authorization: Bearer KEY'; a wrong or "
                f"missing key gets 401. When not given: the environment variable {ADMIN_KEY_ENV}, else only "
                "loopback clients (127.0.0.1, ::1) may call them (docs/gateway.md, 'Admin endpoints')."})

    def __post_init__(self):
        if not isinstance(self.upstream, str) or not self.upstream.startswith(("http://", "https://")):
            raise ParameterError("upstream", self.upstream, "must be an http(s) URL such as http://127.0.0.1:8000/v1, "
                                 f"got {self.upstream!r}")
        check_choice(self.signal, "signal", SIGNALS)
        if self.admin_key is None:
            self.admin_key = os.environ.get(ADMIN_KEY_ENV) or None
        if self.admin_key is not None and (not isinstance(self.admin_key, str) or not self.admin_key.strip()
                                           or self.admin_key != self.admin_key.strip()):
            raise ParameterError("admin_key", "<hidden>", "must be a non-empty string without surrounding spaces "
                                 f"(from --admin-key or {ADMIN_KEY_ENV})")
        for name in ("max_in_flight", "max_reads_in_flight"):
            check_int(getattr(self, name), name)
        for name in ("timeout", "tau_n"):
            check_positive_number(getattr(self, name), name)
        for name in ("abstain_risk", "abstain_delta"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value < 1):
                raise ParameterError(name, value, f"must be a number in (0, 1), got {value!r}")
        if (self.abstain_risk is None) != (self.abstain_calibration is None):
            raise ParameterError("abstain_risk", self.abstain_risk, "{abstain_risk} and {abstain_calibration} go "
                                 "together (the threshold is chosen on the labelled answers)",
                                 related=("abstain_calibration",))
        if self.abstain_risk is not None and self.signal == "none":
            raise ParameterError("abstain_risk", self.abstain_risk, "needs a confidence: {signal} is none",
                                 related=("signal",))
