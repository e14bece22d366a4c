"""Shared test set-up: tests read MBPP from the vendored copy beside the repository."""

import os

from mbpp_location import SHARED_MBPP

if "MBPP_DATASET_PATH" not in os.environ and SHARED_MBPP.exists():
    os.environ["MBPP_DATASET_PATH"] = str(SHARED_MBPP)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# W&B only where a test asks for it (--run.wandb offline): CI exports WANDB_MODE=offline for safety,
# and every in-process or subprocess fit would otherwise write (and resume) offline W&B runs.
os.environ["WANDB_MODE"] = "disabled"
# Before any test imports torch: OpenMP threads that spin while waiting starve the sandbox workers on
# 2 cores (the real-model quickstart test took 346 s with spinning threads, 77 s without).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
