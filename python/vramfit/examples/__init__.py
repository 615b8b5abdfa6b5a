"""Example training scripts that use the helper, one per model family.

Each builds its model from a configuration with random weights and trains on
synthetic data (nothing is downloaded), so it runs anywhere::

    python -m vramfit.examples.gpt2 --steps 20          # HF causal LM (GPT-2 small)
    python -m vramfit.examples.llama                    # HF causal LM (TinyLlama-1.1B architecture)
    python -m vramfit.examples.bert                     # HF masked LM (BERT base)
    python -m vramfit.examples.vision --arch convnext_tiny  # torchvision classifier
    python -m vramfit.examples.mlp                      # plain PyTorch MLP

Under vramfit (a TrainingJob's pod, or ``vramfit run --local JOB.yaml -- python
-m vramfit.examples.gpt2``) the batch shape and memory budget come from the
attempt; ``--absorb`` lets :class:`vramfit.Step` absorb OOMs inside the process.
"""
