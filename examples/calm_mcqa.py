"""CALM with LoRA against the paper's baselines on the same splits (see ``hf_calibration.calm.experiment``).

    python examples/calm_mcqa.py all --output-dir runs/calm_mmlu --n-train 48 --max-steps 12
    python examples/calm_mcqa.py all --model Qwen/Qwen2.5-Coder-0.5B-Instruct --train-domain halueval_qa_lm \
        --output-dir runs/calm_qwen
"""

import sys

from hf_calibration.calm.experiment import cli_main

if __name__ == "__main__":
    sys.exit(cli_main())
