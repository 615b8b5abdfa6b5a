"""Hugging Face causal LM: GPT-2 small (124M) from its configuration, random weights."""

from __future__ import annotations

from .causal_lm import main

if __name__ == "__main__":
    main(description=__doc__ or "")
