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
- ``run_serve(ServeConfig)``: the calibration gateway, an OpenAI-compatible server in front of vLLM.
- ``run_calm(CALMJobConfig, CALMConfig)``: fine-tune with CALM.
- ``run_report(ReportConfig)``: one self-contained HTML page from result folders.
- ``run_lm_eval_import(LMEvalImportConfig)``: calibration reports of lm-evaluation-harness ``--log_samples`` runs.
"""

from hf_calibration.runtime.lazy import lazy_exports

# Each job's module is imported on first use: reading one command's config (the command line's --help) must not
# load every job's stack (torch, transformers, TRL, datasets).
_LAZY = {
    "CALMJobConfig": "hf_calibration.jobs.calm",
    "CALMJobResult": "hf_calibration.jobs.calm",
    "DiagnoseConfig": "hf_calibration.jobs.diagnose",
    "DiagnoseResult": "hf_calibration.jobs.diagnose",
    "EvaluateConfig": "hf_calibration.jobs.evaluate",
    "EvaluateResult": "hf_calibration.jobs.evaluate",
    "FitPosthocConfig": "hf_calibration.jobs.fit_posthoc",
    "FitPosthocResult": "hf_calibration.jobs.fit_posthoc",
    "JobResult": "hf_calibration.jobs.common",
    "LMEvalImportConfig": "hf_calibration.jobs.lm_eval",
    "ReportConfig": "hf_calibration.jobs.report",
    "SECLServiceConfig": "hf_calibration.jobs.secl_service",
    "SECLServiceResult": "hf_calibration.jobs.secl_service",
    "SECLStreamConfig": "hf_calibration.jobs.secl_stream",
    "SECLStreamResult": "hf_calibration.jobs.secl_stream",
    "ServeConfig": "hf_calibration.jobs.serve",
    "run_calm": "hf_calibration.jobs.calm",
    "run_diagnose": "hf_calibration.jobs.diagnose",
    "run_evaluate": "hf_calibration.jobs.evaluate",
    "run_fit_posthoc": "hf_calibration.jobs.fit_posthoc",
    "run_lm_eval_import": "hf_calibration.jobs.lm_eval",
    "run_report": "hf_calibration.jobs.report",
    "run_secl_service": "hf_calibration.jobs.secl_service",
    "run_secl_stream": "hf_calibration.jobs.secl_stream",
    "run_serve": "hf_calibration.jobs.serve",
}

__getattr__, __all__ = lazy_exports(__name__, _LAZY)
