"""Loading weights into an in-process vLLM engine: its runner, its model, and the reload that
processes them as vLLM's own loading does (its CPU build repacks linear weights for its kernels).

Nothing here imports vllm: the engine comes in built (``rlcode.rollout.vllm.engine``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rlcode.rollout.vllm.engine import TESTED_VLLM_VERSIONS


def engine_runner(llm):
    """The model runner of an in-process V1 engine (it holds the model and reloads its weights)."""
    try:
        return llm.llm_engine.model_executor.driver_worker.model_runner
    except AttributeError:
        raise RuntimeError(
            "The vLLM engine's model is not reachable from this process: it must be built in-process "
            f"(distributed_executor_backend='external_launcher', vllm{TESTED_VLLM_VERSIONS})."
        ) from None


def engine_model(llm) -> torch.nn.Module:
    """The torch model inside an in-process V1 engine."""
    runner = engine_runner(llm)
    return runner.get_model() if callable(getattr(runner, "get_model", None)) else runner.model


def load_into_engine(llm, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load (checkpoint name, tensor) pairs into the engine's model, consumed one at a time.

    Where the runner has ``reload_weights`` (vLLM >= 0.32), through it: vLLM processes some weights
    after loading (its CPU build repacks every linear weight for its GEMM kernels and drops their
    loaders), and only its layer-wise reload takes checkpoint tensors again and processes them the
    same way. Otherwise each tensor goes to the model's ``load_weights``, as TRL does.
    """
    runner = engine_runner(llm)
    if callable(getattr(runner, "reload_weights", None)):
        runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        _prepare_tied_weights_again(engine_model(llm))
        return
    model = engine_model(llm)
    for name, tensor in weights:
        model.load_weights([(name, tensor)])


def _prepare_tied_weights_again(model: torch.nn.Module) -> None:
    """vLLM's layer-wise reload processes a tied parameter for the first module holding it only (its
    docs say so): a head tied to the embedding keeps what its kernel prepared from the old weight (on
    CPU a packed copy, so the logits stay the old model's). Each later holder prepares it again."""
    holders: set[int] = set()
    for module in model.modules():
        weight, method = getattr(module, "weight", None), getattr(module, "quant_method", None)
        if not isinstance(weight, torch.Tensor) or method is None:
            continue
        if weight.data_ptr() in holders:
            method.process_weights_after_loading(module)
        holders.add(weight.data_ptr())
