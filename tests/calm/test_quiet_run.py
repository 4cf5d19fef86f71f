"""A CALM run as the README writes it prints no warning the user cannot act on.

Before the fix every CPU run showed DeepSpeed's "Setting accelerator to CPU" notice and torch's
"'pin_memory' argument is set as true but no accelerator is found" (transformers pins by default).
"""

import subprocess
import sys
import warnings

import torch
from peft import LoraConfig

from hf_calibration.calm import CALMConfig, CALMTrainer
from tests.tiny import make_tiny_model


def test_deepspeed_import_after_a_calm_trainer_is_quiet_on_a_cpu_machine():
    if torch.cuda.is_available():  # the notice only exists where DeepSpeed falls back to the CPU
        return
    # importing the package changes nothing; building a trainer (where DeepSpeed may load next) quiets the notice
    code = ("import os\nimport hf_calibration.calm\nassert 'DS_ACCELERATOR' not in os.environ\n"
            "from tests.tiny import make_tiny_model, make_tiny_tokenizer\n"
            "from datasets import Dataset\nfrom hf_calibration.calm import CALMConfig, CALMTrainer\n"
            "tok = make_tiny_tokenizer()\n"
            "data = Dataset.from_dict({'prompt': ['Q? Answer:'] * 2, 'completion': [' A', ' B']})\n"
            "CALMTrainer(make_tiny_model(tok), CALMConfig(__import__('tempfile').mkdtemp(), method='sft', report_to='none'),\n"
            "            train_dataset=data, processing_class=tok)\n"
            "try:\n    import deepspeed\nexcept ImportError:\n    pass\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PATH": "", "HF_HUB_OFFLINE": "1", "PYTHONPATH": ":".join(sys.path)})
    assert proc.returncode == 0, proc.stderr
    assert "Setting accelerator to CPU" not in proc.stdout + proc.stderr


def test_readme_style_run_raises_no_warning(tmp_path, tiny_tokenizer, mcqa_data):
    train, calibration = mcqa_data
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the README's arguments, shortened: nothing about checkpointing, pinning or lengths is set by the user
        args = CALMConfig(output_dir=str(tmp_path / "calm"), method="bome", inner_steps=1, eta=0.5, max_steps=1,
                          per_device_train_batch_size=4, learning_rate=1e-3, alpha_learning_rate=5e-2,
                          report_to="none", disable_tqdm=True)
        trainer = CALMTrainer(make_tiny_model(tiny_tokenizer), args, train_dataset=train,
                              calibration_dataset=calibration, processing_class=tiny_tokenizer,
                              peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                     task_type="CAUSAL_LM"))
        trainer.train()
        trainer.save_model()
    messages = [f"{w.category.__name__}: {w.message}" for w in caught]
    assert messages == []
