"""hf_calibration: calibrated confidence for Hugging Face language models."""

__version__ = "0.1.0"
