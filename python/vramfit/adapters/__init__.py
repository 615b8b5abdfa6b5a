"""Thin adapters for training frameworks: PyTorch Lightning and the Hugging Face Trainer.

Import the one you use (``vramfit.adapters.lightning`` or
``vramfit.adapters.huggingface``); each imports its framework only when imported.
"""
