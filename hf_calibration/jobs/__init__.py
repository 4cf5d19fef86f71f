"""Jobs: each a typed config, a function and a typed result, callable without the command line.

``run_x(config: XConfig) -> XResult``, as a TRL script takes its dataclasses; ``hf-calibration <command>``
parses the same dataclasses (their fields' ``metadata["help"]`` is the option help) and calls these
functions. Every config checks its fields at construction, and every job checks its files and model path
before a model loads, raising ``hf_calibration.errors.ParameterError`` naming the field.

- ``run_evaluate(EvaluateConfig)``: score MCQA questions, report calibration metrics.
- ``run_fit_posthoc(FitPosthocConfig)``: fit a post-hoc calibrator on ``run_evaluate``'s predictions.
- ``run_diagnose(DiagnoseConfig)``: the generation–discrimination gap; will SECL help this model?
- ``run_secl_stream(SECLStreamConfig, SECLConfig)``: a multi-domain stream through SECL with the baselines.
- ``run_secl_service(SECLServiceConfig, SECLConfig)``: a stream through SECL beside a vLLM server, adapters hot-swapped.
- ``run_calm(CALMJobConfig, CALMConfig)``: fine-tune with CALM.
- ``run_report(ReportConfig)``: one self-contained HTML page from result folders.
- ``run_lm_eval_import(LMEvalImportConfig)``: calibration reports of lm-evaluation-harness ``--log_samples`` runs.
"""

from hf_calibration.jobs.calm import CALMJobConfig, CALMJobResult, run_calm
from hf_calibration.jobs.common import JobResult
from hf_calibration.jobs.diagnose import DiagnoseConfig, DiagnoseResult, run_diagnose
from hf_calibration.jobs.evaluate import EvaluateConfig, EvaluateResult, run_evaluate
from hf_calibration.jobs.fit_posthoc import FitPosthocConfig, FitPosthocResult, run_fit_posthoc
from hf_calibration.jobs.lm_eval import LMEvalImportConfig, run_lm_eval_import
from hf_calibration.jobs.report import ReportConfig, run_report
from hf_calibration.jobs.secl_service import SECLServiceConfig, SECLServiceResult, run_secl_service
from hf_calibration.jobs.secl_stream import SECLStreamConfig, SECLStreamResult, run_secl_stream

__all__ = [
    "CALMJobConfig",
    "CALMJobResult",
    "DiagnoseConfig",
    "DiagnoseResult",
    "EvaluateConfig",
    "EvaluateResult",
    "FitPosthocConfig",
    "FitPosthocResult",
    "JobResult",
    "LMEvalImportConfig",
    "ReportConfig",
    "SECLServiceConfig",
    "SECLServiceResult",
    "SECLStreamConfig",
    "SECLStreamResult",
    "run_calm",
    "run_diagnose",
    "run_evaluate",
    "run_fit_posthoc",
    "run_lm_eval_import",
    "run_report",
    "run_secl_service",
    "run_secl_stream",
]
