"""``--trainer.strategy fsdp``: FSDP2 data-parallel sharding of the policy, as a Lightning strategy.

Lightning's word "fsdp" names its FSDP1 strategy, which wraps the module's ``forward``: a GRPO step
generates and runs several forward/backward passes outside it, and FSDP1 cannot run on CPU. rlcode
maps the word to ``FSDP2Strategy`` instead: Lightning's ``ModelParallelStrategy`` with every rank in
one data-parallel dimension (its default mesh would be one tensor-parallel group of all local ranks,
which syncs nothing) and the sharding applied by the Learner's ``configure_model``
(``rlcode.models.sharding``). Checkpoints are sharded (torch distributed checkpoint, a folder per
checkpoint); ``rlcode export`` turns one into a Hugging Face folder.

Precision: bf16-mixed becomes FSDP2's mixed precision (bf16 gathered parameters and compute, fp32
gradient reduction and master weights); 16-mixed is refused (``sharding.precision_policy`` says why
and what to use); tensor parallelism is not offered (rlcode's models fit a GPU's share once sharded,
and a GRPO step is generation-bound: data parallelism scales it).
"""

from __future__ import annotations

from lightning.pytorch.strategies import ModelParallelStrategy

STRATEGY_WORDS = ("fsdp", "fsdp2")  # what users write for it (``fsdp`` is Lightning's own word)


class FSDP2Strategy(ModelParallelStrategy):
    """Data-parallel FSDP2 over every rank (no tensor parallelism), sharded checkpoints."""

    def __init__(self, **kwargs) -> None:
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1, save_distributed_checkpoint=True, **kwargs)

    def setup_environment(self) -> None:
        # The world size is known once the launcher has set nodes and processes: all of it data parallel.
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


def resolve_strategy(strategy):
    """The strategy to give the Trainer: ``FSDP2Strategy`` for the words above, else ``strategy`` itself."""
    if isinstance(strategy, str) and strategy.lower() in STRATEGY_WORDS:
        return FSDP2Strategy()
    return strategy


def sharding_refusal(strategy) -> str | None:
    """Why rlcode cannot train under ``strategy`` (one line naming the fix), or None."""
    from lightning.pytorch.strategies import FSDPStrategy

    if isinstance(strategy, FSDPStrategy):
        return ("Lightning's FSDPStrategy (FSDP1) wraps only the module's forward, and a training step generates "
                "and runs passes outside it: use --trainer.strategy fsdp (rlcode's FSDP2) or ddp")
    if isinstance(strategy, ModelParallelStrategy) and not isinstance(strategy, FSDP2Strategy):
        if strategy._tensor_parallel_size not in (1, "auto") or strategy._data_parallel_size != strategy.world_size:
            return ("tensor parallelism is not supported: a ModelParallelStrategy must be all data parallel "
                    "(data_parallel_size = world size, tensor_parallel_size 1); use --trainer.strategy fsdp")
    return None
