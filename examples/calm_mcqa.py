"""CALM with LoRA against the paper's baselines on the same splits, as a TRL-style script: parse the typed
configs of the calm experiment (``hf_calibration.jobs``) and call the job; ``hf-calibration experiment calm``
does the same.

    python examples/calm_mcqa.py --models smollm2 --datasets mmlu:stem --n-train 48 --max-steps 12 \
        --output-dir runs/calm_mmlu
    python examples/calm_mcqa.py --models qwen --datasets halueval_qa_lm --output-dir runs/calm_qwen
"""

import sys

from trl import TrlParser

from hf_calibration.jobs import CALMExperimentConfig, ExperimentConfig, run_experiment

if __name__ == "__main__":
    parser = TrlParser((ExperimentConfig, CALMExperimentConfig), allow_abbrev=False)
    experiment, calm = parser.parse_args_and_config(["--name", "calm", *sys.argv[1:]])
    print(run_experiment(experiment, calm).table)
