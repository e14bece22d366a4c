"""4-bit QLoRA inside GRPO on CPU (bitsandbytes runs NF4 on the CPU), a model handed in by the user,
``rlcode export``, and the Colab notebook executed top to bottom.

GRPO steps run on fixed rollouts (``grpo_harness``): what is tested is the update of a 4-bit base
with adapters, not generation.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from grpo_harness import build_module, fit_steps

REPO = Path(__file__).resolve().parents[1]
LORA = {"r": 4, "alpha": 8, "dropout": 0.0}


def four_bit_weights(policy) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in policy.named_parameters() if type(p).__name__ == "Params4bit"}


def adapters(policy) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in policy.named_parameters() if p.requires_grad}


def test_two_grpo_steps_of_4bit_qlora_train_the_adapters_only_and_resume(tmp_path):
    """GRPO had no quantization setting (and the loader asked for a CUDA device)."""
    module = build_module(quantization="4bit", lora=LORA)
    base, start = four_bit_weights(module.policy), adapters(module.policy)
    assert base and all(w.dtype == torch.uint8 for w in base.values()), "the base is stored in 4 bits"
    trainer = fit_steps(module, steps=2)
    assert trainer.global_step == 2 and module.last_step.updated
    now = adapters(module.policy)
    assert any(not torch.equal(now[k], start[k]) for k in start), "the adapters changed"
    after = four_bit_weights(module.policy)
    assert after.keys() == base.keys() and all(torch.equal(after[k], base[k]) for k in base), "base untouched, 4-bit"

    path = tmp_path / "qlora.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, map_location="cpu", weights_only=False)
    assert saved["state_dict"] and all("lora_" in key for key in saved["state_dict"]), "adapters only"
    assert saved["hyper_parameters"]["quantization"] == "4bit"

    resumed = build_module(quantization="4bit", lora=LORA)
    trainer = fit_steps(resumed, steps=3, ckpt_path=str(path))
    assert trainer.global_step == 3
    assert four_bit_weights(resumed.policy).keys() == base.keys()


def test_quantization_without_lora_is_a_one_line_error():
    from rlcode.modes import GRPO
    from grpo_harness import learner

    with pytest.raises(ValueError, match="quantization='4bit' needs model.lora"):
        learner(GRPO, model_name="tiny-random", quantization="4bit")


def user_4bit_model():
    """The tiny model loaded in 4 bits by the user's own code, and its source."""
    from transformers import AutoModelForCausalLM

    from rlcode.models import resolve_model_source
    from rlcode.models.adapters import quantization_config

    source = resolve_model_source("tiny-random")
    model = AutoModelForCausalLM.from_pretrained(source, quantization_config=quantization_config("4bit", torch.float32),
                                                 device_map={"": "cpu"})
    return model, source


def test_a_model_built_by_the_user_gets_its_tokenizer_and_backend_set_up():
    """A user-set policy left the tokenizer and the rollout backend unset."""
    from transformers import AutoTokenizer

    from grpo_harness import use_fixed_rollouts
    from rlcode.modes import GRPO
    from rlcode.training.learner import Learner

    model, source = user_4bit_model()
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.padding_side = "right"
    module = Learner.from_pretrained_model(model, tokenizer, mode=GRPO(rewards=["grpo_harness:length_reward"],
                                                                       num_generations=4),
                                           lora=LORA, max_new_tokens=6, learning_rate=1e-3)
    assert "policy" not in module.hparams and module.hparams.model_name == source
    assert module.tokenizer.padding_side == "left" and module.tokenizer.pad_token is not None
    module.configure_model()
    assert module.backend is not None
    rollout = module.generate([module.render([{"role": "user", "content": "hi"}])], 2, temperature=1.0, seed=0)
    assert rollout.completion_ids.shape[0] == 2, "the backend generates with the user's model"
    use_fixed_rollouts(module)
    start = adapters(module.policy)
    fit_steps(module, steps=1)
    assert any(not torch.equal(p, start[n]) for n, p in adapters(module.policy).items())


def test_export_of_a_missing_checkpoint_is_a_one_line_error(tmp_path):
    from rlcode.cli.command import main

    with pytest.raises(SystemExit, match="no checkpoint at"):
        main(["export", "--ckpt", str(tmp_path / "nope.ckpt"), "--out", str(tmp_path / "out")])


@pytest.mark.slow
def test_the_qlora_notebook_runs_top_to_bottom_on_cpu(tmp_path, monkeypatch):
    """notebooks/grpo_qlora_mbpp.ipynb in a real Jupyter kernel, with the tiny model in 4-bit, 2 steps:
    it says which sandbox level holds, scores MBPP before and after, trains, writes last.ckpt, shows the
    plot and saves a peft adapter folder; its outputs hold no ipywidgets warning and no logger advert."""
    import nbformat
    from nbclient import NotebookClient

    for name, value in {"RLCODE_NOTEBOOK_MODEL": "tiny-random", "RLCODE_NOTEBOOK_STEPS": "2",
                        "RLCODE_NOTEBOOK_GENERATIONS": "2", "RLCODE_NOTEBOOK_MAX_NEW_TOKENS": "8",
                        "RLCODE_NOTEBOOK_EVAL_PROBLEMS": "2",
                        "RLCODE_NOTEBOOK_OUT": str(tmp_path / "out"),
                        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}.items():
        monkeypatch.setenv(name, value)
    notebook = nbformat.read(REPO / "notebooks/grpo_qlora_mbpp.ipynb", as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    adapter = tmp_path / "out/adapter"
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])]
    assert any("image/png" in output.get("data", {}) for output in outputs), "the plot is shown"
    run_dir = tmp_path / "out/qlora/version_0"
    assert (run_dir / "checkpoints/last.ckpt").is_file(), "a checkpoint is written"
    assert {p.name for p in (run_dir / "eval").iterdir()} == {"step_0.json", "step_2.json"}, "MBPP before and after"
    text = "\n".join(output.get("text", "") + "".join(str(v) for v in output.get("data", {}).values()
                                                        if not isinstance(v, dict))
                     for output in outputs if "image/png" not in output.get("data", {}))
    for line in ("MBPP eval at step 0 (validation): pass rate", "MBPP eval at step 2 (validation): pass rate",
                 "MBPP eval step_2.json: pass rate", "checkpoint: ", "sandbox isolation: "):
        assert line in text, line
    for noise in ("ipywidgets", "IProgress", "litlogger", "Tip:"):
        assert noise not in text, noise


def packed_for_cpu_inference(model) -> list[bool]:
    return [getattr(m.weight.quant_state, "packing_format_for_cpu", False)
            for m in model.modules() if hasattr(m, "support_avx512bf16_for_cpu")]


def test_4bit_layers_still_train_after_eval_mode_passes():
    """Guards a CI failure: on an AVX512-BF16 CPU bitsandbytes repacks a 4-bit weight for inference at
    its first eval-mode pass without gradients (a user's own generation, an MBPP eval), and the packed
    weight has no backward, so the next training step failed."""
    from transformers import AutoTokenizer

    from grpo_harness import use_fixed_rollouts
    from rlcode.modes import GRPO
    from rlcode.training.learner import Learner

    model, source = user_4bit_model()
    ids = torch.tensor([[3, 17, 42, 99, 5]])
    with torch.no_grad():
        model.eval()(input_ids=ids)  # the user tried the model before handing it over
    module = Learner.from_pretrained_model(model, AutoTokenizer.from_pretrained(source), lora=LORA,
                                           mode=GRPO(rewards=["grpo_harness:length_reward"], num_generations=4),
                                           max_new_tokens=6, learning_rate=1e-3)
    module.configure_model()
    layers = packed_for_cpu_inference(module.policy)
    assert layers and not any(layers), "a weight packed before hand-over is unpacked"
    with torch.no_grad():
        module.policy.eval()(input_ids=ids)  # what an MBPP eval does between training steps
    assert not any(packed_for_cpu_inference(module.policy))
    use_fixed_rollouts(module)
    start = adapters(module.policy)
    fit_steps(module, steps=1)
    assert any(not torch.equal(p, start[n]) for n, p in adapters(module.policy).items())
