"""CPU-only plumbing for ``accelerate launch`` runs of the trainers (DDP over gloo, DeepSpeed ZeRO on CPU).

On GPUs nothing here is needed: ``accelerate launch --config_file examples/accelerate_configs/<x>.yaml``
and a plain ``CALMConfig`` work as with any TRL trainer, and ``cpu_training_kwargs()`` returns ``{}``.
On a machine without GPUs (CI, these test machines) two accelerate quirks need working around (docs/distributed.md):

- ``accelerate launch --cpu --num_processes 2`` silently starts ONE process. Real 2-process CPU runs
  are launched as multi-GPU (``--multi_gpu --num_processes 2``, or the ``*_cpu.yaml`` configs) and the
  script asks for the CPU (``use_cpu=True`` → ``Accelerator(cpu=True)``), which gives gloo DDP.
- DeepSpeed (0.19) runs ZeRO 0–3 on CPU over gloo, but under accelerate + Trainer with 2 processes the
  process group must already exist as gloo before the ``Accelerator`` is made: a
  ``PartialState(backend="gloo")`` first, then ``accelerator_config={"use_configured_state": True}``
  so the Trainer reuses it (otherwise accelerate asserts on the batch size).

``cpu_training_kwargs()`` does whichever applies and returns the extra ``TrainingArguments`` /
``CALMConfig`` keyword arguments; examples and tests call it once, before building the config.
"""

from __future__ import annotations

import os

__all__ = ["cpu_training_kwargs", "launched_with_deepspeed", "quiet_deepspeed_cpu_notice"]


def quiet_deepspeed_cpu_notice() -> None:
    """Tell DeepSpeed it runs on the CPU where that is the only device, so it does not say so as a WARNING.

    DeepSpeed, when importable, is imported by the Trainer; on a machine without an accelerator it
    probes, falls back to the CPU and logs "Setting accelerator to CPU. If you have GPU or other
    accelerator, we were unable to detect it." on every run, a warning the user can do nothing about.
    ``DS_ACCELERATOR=cpu`` is DeepSpeed's own switch for the same choice. It is set only when no
    device DeepSpeed could use is present (CUDA, XPU, MPS, or the NPU/HPU/MLU plug-ins), and never over
    a value the user set. Called where DeepSpeed may be imported next (``CALMTrainer()``,
    ``cpu_training_kwargs()``), never on import of the package.
    """
    import importlib.util

    import torch

    if "DS_ACCELERATOR" in os.environ or torch.cuda.is_available() or torch.backends.mps.is_available():
        return
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return
    if any(importlib.util.find_spec(m) is not None for m in ("torch_npu", "habana_frameworks", "torch_mlu",
                                                              "torch_sdaa", "intel_extension_for_pytorch")):
        return
    os.environ["DS_ACCELERATOR"] = "cpu"


def launched_with_deepspeed() -> bool:
    """True when this process was started by ``accelerate launch`` with DeepSpeed (``ACCELERATE_USE_DEEPSPEED``)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true", "yes")


def cpu_training_kwargs() -> dict:
    """Extra ``TrainingArguments`` kwargs that make the current ``accelerate launch`` run on CPU; ``{}`` with a GPU.

    - a CUDA/XPU/MPS device is available: ``{}`` (the launch config decides everything);
    - launched with DeepSpeed: creates ``PartialState(backend="gloo")`` now (side effect: the
      process group is initialised) and returns ``{"accelerator_config": {"use_configured_state": True}}``;
    - otherwise (DDP launched as ``--multi_gpu``, torchrun, or a single process): ``{"use_cpu": True}``,
      i.e. ``Accelerator(cpu=True)`` and gloo when there are several processes.

    CPU-only plumbing for tests and small runs; it does not make CPU training fast.
    """
    import torch

    if torch.cuda.is_available() or getattr(torch, "xpu", None) and torch.xpu.is_available() \
            or torch.backends.mps.is_available():
        return {}
    if launched_with_deepspeed():
        from accelerate import PartialState

        quiet_deepspeed_cpu_notice()  # accelerate imports DeepSpeed here
        PartialState(backend="gloo")
        return {"accelerator_config": {"use_configured_state": True}}
    return {"use_cpu": True}
