"""Integrations with other tools: lm-evaluation-harness (import its logs, ECE inside its tasks), the
Hugging Face Hub (model cards, pushing artifacts) and Spaces (a metric's Gradio page)."""
