"""rlcode: train code-writing language models with reinforcement learning on PyTorch Lightning.

Importing the package is cheap on purpose: torch, transformers and peft load only where a
module uses them, so `rlcode-eval` and the sandbox start in well under a second.
"""

__version__ = "0.1.0"
