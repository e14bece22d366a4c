"""What a checkpoint needs beyond weights, optimizer and data position to resume *exactly*.

Lightning saves the weights, the optimizer, the loop counters and every ``state_dict`` of the
DataModule and callbacks. It does not save random number generators, so a resumed run re-seeds
them (``seed_everything``) and anything random after step k (a user's reward that samples, dropout,
an estimator that shuffles) diverges from the run that was never stopped. This module adds, under
``checkpoint["rlcode_resume"]``:

- the RNG states of python, numpy, torch (CPU and every CUDA device) of every rank, taken when the
  checkpoint is written, i.e. between two steps;
- the training mode's state (``Mode.state_dict``: its reward functions' state, e.g. a curriculum,
  and its advantage estimator's, e.g. SPIRAL's per-role baselines), under ``parts["mode"]``.

The mode's state is loaded with the checkpoint. The RNG states are put back at the first training
batch after the restore, not when the checkpoint is loaded: between the two, Lightning creates the dataloader iterator, which draws a base seed from
torch's generator that the uninterrupted run drew long before. Sampling needs nothing here: each
step's generation seed is a function of (generation_seed, step, rank).
"""

from __future__ import annotations

import random
from typing import Any, Protocol

import torch

KEY = "rlcode_resume"


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def rng_states() -> dict[str, Any]:
    """Every generator a training step may draw from."""
    import numpy as np

    # Plain types and tensors only: Lightning loads checkpoints with torch's weights_only unpickler,
    # which refuses numpy arrays.
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    states = {"python": random.getstate(), "torch": torch.get_rng_state(),
              "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss), float(gauss)]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(_as_python_state(states["python"]))
    kind, keys, position, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    torch.set_rng_state(states["torch"].cpu())
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([state.cpu() for state in states["cuda"]])


def capture(parts: dict[str, Stateful], states: dict[str, Any] | None = None) -> dict[str, Any]:
    """The checkpoint entry: every rank's RNG states now (or ``states``, taken earlier), and each part's state.

    Every rank builds the checkpoint (rank zero alone writes it), so under DDP the ranks' generator
    states are gathered here, one collective per save, and each rank later takes back its own.
    """
    states = rng_states() if states is None else states
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: list = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, states)
    else:
        gathered = [states]
    return {"rng_by_rank": gathered,
            "parts": {name: part.state_dict() for name, part in parts.items() if part is not None}}


def own_rng_states(entry: dict[str, Any], rank: int) -> dict[str, Any]:
    """This rank's saved states (rank zero's when the checkpoint came from fewer ranks)."""
    by_rank = entry["rng_by_rank"]
    return by_rank[rank] if rank < len(by_rank) else by_rank[0]


def restore_parts(entry: dict[str, Any], parts: dict[str, Stateful]) -> None:
    """Load each part's saved state; a part the checkpoint lacks (added since) keeps its fresh state."""
    saved = entry.get("parts", {})
    for name, part in parts.items():
        if part is not None and name in saved:
            part.load_state_dict(saved[name])


def _as_python_state(state):
    # torch.load gives tuples back as lists in some versions; random.setstate needs tuples
    if isinstance(state, list):
        return tuple(_as_python_state(item) if isinstance(item, list) else item for item in state)
    return state


class ExactResume:
    """LightningModule mixin: saves the entry with each checkpoint (the module's ``mode`` as its one
    part), loads the mode's state with the checkpoint and the RNG states at the first batch."""

    _pending_rng: dict[str, Any] | None = None

    def save_resume_state(self, checkpoint: dict[str, Any]) -> None:
        # After a step given up mid-way (a stop signal), the generators as that step found them: the
        # resumed run redoes it from there.
        checkpoint[KEY] = capture({"mode": self.mode}, getattr(self, "abandoned_step_rng", None))

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        entry = checkpoint.get(KEY)
        if entry is not None:
            restore_parts(entry, {"mode": self.mode})
        self._pending_rng = entry

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        if self._pending_rng is not None:
            entry, self._pending_rng = self._pending_rng, None
            set_rng_states(own_rng_states(entry, getattr(self, "global_rank", 0)))
