"""The vLLM backend against a stand-in vllm module (no engine: vLLM needs CUDA).

What is checked is everything the backend decides itself: engine keywords and environment per rank,
the trainer's state around the build, token-id prompts, per-prompt seeds, sampling rules, output
mapping, the lazy weight sync, sleep/wake order and the weights' names and values.
"""

from __future__ import annotations

import os
import random
import sys

import numpy
import pytest
import torch

import vllm_stand_in
from rlcode.models import LoraSettings, load_model, load_tokenizer, resolve_model_source
from rlcode.rollout import SamplingParams
from rlcode.rollout.vllm.engine import (
    VLLMSettings,
    build_engine,
    engine_keywords,
    launcher_environment,
    placement_for,
)
from rlcode.rollout.vllm.requests import prompt_seeds

PROMPTS = ["def add(a, b):", "class Stack:"]


@pytest.fixture
def vllm(monkeypatch):
    stand_in = vllm_stand_in.module()
    monkeypatch.setitem(sys.modules, "vllm", stand_in)
    return stand_in


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


@pytest.fixture(scope="module")
def policy():
    return load_model("tiny-random").eval()


def make_backend(policy, tokenizer, **settings):
    from rlcode.rollout import VLLMBackend

    # The tiny model's folder: the strict stand-in checks pushed weights against its checkpoint names.
    return VLLMBackend(policy, tokenizer, resolve_model_source("tiny-random"), settings=VLLMSettings(**settings),
                       seed=5)


def sample(temperature=1.0, max_new_tokens=6, seed=3, **extra):
    return SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed, **extra)


def fake_world(monkeypatch, rank: int, world_size: int) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: rank)
    monkeypatch.setattr(dist, "get_world_size", lambda: world_size)


# ---- building the engine ----------------------------------------------------------------------
@pytest.mark.parametrize("rank, device_index", [(0, 0), (1, 1), (0, 2), (1, 3)])  # devices=[2, 3] too
def test_each_rank_builds_its_engine_in_process_on_its_own_gpu(vllm, monkeypatch, rank, device_index):
    fake_world(monkeypatch, rank, 2)
    for name in vllm_stand_in.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    settings = VLLMSettings(max_model_len=1024, max_num_seqs=32, enable_sleep_mode=True)
    placement = placement_for(torch.device("cuda", device_index))
    llm = build_engine(vllm, settings, "some/model", seed=11 + rank, placement=placement)

    assert llm.environment == {"RANK": str(rank), "LOCAL_RANK": str(device_index), "WORLD_SIZE": "2",
                               "MASTER_ADDR": None, "MASTER_PORT": None,  # the trainer's world exists
                               "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert llm.kwargs == {
        "model": "some/model", "distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1,
        "seed": 11 + rank, "dtype": "auto", "gpu_memory_utilization": 0.3, "kv_cache_memory_bytes": None,
        "max_model_len": 1024,
        "max_num_seqs": 32, "max_num_batched_tokens": 4096, "enable_prefix_caching": True,
        "enforce_eager": False, "enable_sleep_mode": True, "logprobs_mode": "processed_logprobs"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # scoped to the build
        assert name not in os.environ


def test_a_single_process_gets_a_rendezvous_and_keeps_its_own(vllm, monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    env = launcher_environment(placement_for(torch.device("cpu")))
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == ("0", "1", "localhost")
    assert int(env["MASTER_PORT"]) > 0
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")
    monkeypatch.setenv("MASTER_PORT", "29555")
    env = launcher_environment(placement_for(torch.device("cpu")))
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.7", "29555")
    llm = build_engine(vllm, VLLMSettings(), "some/model", seed=0, placement=placement_for(torch.device("cpu")))
    assert llm.environment["MASTER_PORT"] == "29555" and os.environ["MASTER_PORT"] == "29555"


def test_the_build_puts_back_gc_the_environment_cache_and_matmul_precision(vllm, monkeypatch):
    import gc

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # what a trainer on an Ampere+ GPU usually sets
    try:
        assert gc.get_freeze_count() == 0 and not vllm.envs._is_envs_cache_enabled()
        llm = build_engine(vllm, VLLMSettings(), "some/model", seed=1, placement=placement_for(torch.device("cpu")))
        assert llm.kwargs["seed"] == 1
        assert torch.get_float32_matmul_precision() == "high"  # the engine set "highest"
        assert gc.get_freeze_count() == 0  # the engine froze the heap
        assert not vllm.envs._is_envs_cache_enabled()  # the engine cached vllm.envs
    finally:
        torch.set_float32_matmul_precision(previous)
        gc.unfreeze()


def test_building_on_some_ranks_only_is_a_clear_error_not_a_hang(monkeypatch):
    import threading

    from torch.distributed import HashStore

    from rlcode.rollout.vllm.engine import EnginePlacement, wait_for_every_rank

    store = HashStore()
    ranks = [EnginePlacement(rank=rank, local_rank=rank, world_size=2, distributed_ready=True) for rank in (0, 1)]
    with pytest.raises(RuntimeError, match="Only 1 of 2 ranks reached the vLLM engine build"):
        wait_for_every_rank(ranks[0], 0, store=store, timeout_s=0.3)  # rank 1 never builds
    other = threading.Thread(target=wait_for_every_rank, args=(ranks[1], 1, store, 30.0))
    other.start()
    wait_for_every_rank(ranks[0], 1, store=store, timeout_s=30.0)  # both ranks build: both return
    other.join(timeout=30.0)
    assert not other.is_alive()


def test_the_build_leaves_the_trainers_state_as_it_was(vllm):
    """Outside Lightning's dtype/device contexts, inference mode and autocast; generators untouched."""
    states = random.getstate(), numpy.random.get_state(), torch.get_rng_state()
    expected = random.random(), numpy.random.rand(), torch.rand(2)
    random.setstate(states[0]), numpy.random.set_state(states[1]), torch.set_rng_state(states[2])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # as Lightning's "bf16-true" tensor_init_context does
    try:
        with torch.device("meta"), torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            llm = build_engine(vllm, VLLMSettings(), "some/model", seed=123,
                               placement=placement_for(torch.device("cpu")))
        assert torch.get_default_dtype() == torch.bfloat16
    finally:
        torch.set_default_dtype(previous)
    assert (llm.default_dtype, llm.default_device.type, llm.inference_mode, llm.autocast) == (
        torch.float32, "cpu", False, False)
    assert (random.random(), numpy.random.rand()) == expected[:2]  # the engine's reseeding was undone
    assert torch.equal(torch.rand(2), expected[2])


def test_settings_reject_bad_values():
    for bad in (dict(gpu_memory_utilization=0), dict(max_model_len=0), dict(importance_sampling_cap=0.5)):
        with pytest.raises(ValueError, match="vllm"):
            VLLMSettings(**bad)
    assert engine_keywords(VLLMSettings(max_model_len=None), "m", 0)["max_model_len"] is None


def test_max_model_len_unset_comes_from_the_model_and_one_over_its_limit_is_refused():
    from types import SimpleNamespace

    from rlcode.rollout.vllm.engine import DEFAULT_MAX_MODEL_LEN, model_max_len

    assert model_max_len(VLLMSettings(), SimpleNamespace(max_position_embeddings=2048)) == 2048
    assert model_max_len(VLLMSettings(), SimpleNamespace(max_position_embeddings=32768)) == DEFAULT_MAX_MODEL_LEN
    assert model_max_len(VLLMSettings(), SimpleNamespace()) == DEFAULT_MAX_MODEL_LEN
    assert model_max_len(VLLMSettings(max_model_len=1024), SimpleNamespace(max_position_embeddings=2048)) == 1024
    with pytest.raises(ValueError, match="max_model_len=4096 exceeds the model's limit of 2048"):
        model_max_len(VLLMSettings(max_model_len=4096), SimpleNamespace(max_position_embeddings=2048))


def test_a_kv_cache_size_in_gib_goes_to_vllm_in_bytes():
    assert engine_keywords(VLLMSettings(kv_cache_gib=0.5), "m", 0)["kv_cache_memory_bytes"] == 2**29
    with pytest.raises(ValueError, match="kv_cache_gib=0"):
        VLLMSettings(kv_cache_gib=0)


def test_without_vllm_the_error_says_how_to_get_it(monkeypatch, policy, tokenizer):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"rlcode\[vllm\]"):
        make_backend(policy, tokenizer)


# ---- requests and outputs ---------------------------------------------------------------------
def test_prompts_go_as_token_ids_without_added_special_tokens(vllm, policy, tokenizer):
    class AddsBos:
        """A Llama-like tokenizer: a BOS in front unless add_special_tokens=False."""

        pad_token_id, eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id

        def __call__(self, texts, add_special_tokens=True):
            ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
            return {"input_ids": [[1] + row if add_special_tokens else row for row in ids]}

    prompts = [tokenizer.bos_token + "user\nhi", "def f():"]
    backend = make_backend(policy, AddsBos())
    batch = backend.generate(prompts, 2, sample())
    sent = backend.llm.prompts[0]
    expected = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    assert [prompt["prompt_token_ids"] for prompt in sent] == expected
    assert batch.prompt_ids[0][batch.prompt_mask[0].bool()].tolist() == expected[0]


def test_each_prompt_gets_its_own_seed_and_every_sample_a_distinct_draw(vllm, policy, tokenizer):
    backend = make_backend(policy, tokenizer)
    same = "def add(a, b):"
    batch = backend.generate([same, same, "class Stack:"], 4, sample(seed=7, max_new_tokens=8))
    params = backend.llm.sampling_params[0]
    seeds = [p.seed for p in params]
    assert len(params) == 3 and all(p.n == 4 for p in params)
    assert seeds == prompt_seeds(7, 3, 4)
    assert len({seed + j for seed in seeds for j in range(4)}) == 12  # vLLM draws sample j with seed + j
    assert batch.completion_ids[:4].tolist() != batch.completion_ids[4:8].tolist()  # identical prompts differ
    assert prompt_seeds(8, 3, 4) != seeds


def test_greedy_groups_ask_one_completion_and_repeat_it(vllm, policy, tokenizer):
    backend = make_backend(policy, tokenizer)
    batch = backend.generate(PROMPTS, 3, sample(temperature=0.0))
    assert [p.n for p in backend.llm.sampling_params[0]] == [1, 1]
    rows = batch.completion_ids.tolist()
    assert rows[0] == rows[1] == rows[2] and rows[3] == rows[4] == rows[5]
    assert len(batch) == 6


def test_a_step_without_a_seed_leaves_the_trainers_numpy_generator_alone(vllm, policy, tokenizer):
    backend = make_backend(policy, tokenizer)
    backend.engine()
    state = numpy.random.get_state()
    expected = numpy.random.rand()
    numpy.random.set_state(state)
    backend.generate(PROMPTS, 2, sample(seed=None))
    backend.generate(PROMPTS, 2, sample(seed=None))
    assert numpy.random.rand() == expected  # vLLM's sampler draws unseeded requests' seeds from it
    first, second = (backend.llm.sampling_params[index] for index in (0, 1))
    assert all(params.seed is not None for params in first + second)
    assert [p.seed for p in first] != [p.seed for p in second]  # still a fresh draw per step


@pytest.mark.parametrize("extra, message", [
    (dict(top_p=0.9), "top_p=0.9 with vllm importance_sampling_correction"),
    (dict(top_k=20), "top_k=20 with vllm importance_sampling_correction"),
    (dict(temperature=0.005), "temperature=0.005 is below 0.01"),
])
def test_sampling_that_would_bias_the_correction_is_refused(vllm, policy, tokenizer, extra, message):
    backend = make_backend(policy, tokenizer)
    with pytest.raises(ValueError, match=message):
        backend.generate(PROMPTS, 2, sample(**extra))
    assert backend.llm is None  # refused before building anything


def test_what_vllm_would_change_or_bias_is_what_is_refused(vllm, policy, tokenizer):
    """The stand-in applies vLLM's own rule: 0.005 would be sampled at 0.01. Without the correction
    top-p / top-k are allowed (sampled as asked); greedy ignores them in vLLM and here."""
    assert vllm.SamplingParams(temperature=0.005).temperature == 0.01
    backend = make_backend(policy, tokenizer, importance_sampling_correction=False)
    backend.generate(PROMPTS, 2, sample(top_p=0.9, top_k=20))
    assert (backend.llm.sampling_params[0][0].top_p, backend.llm.sampling_params[0][0].top_k) == (0.9, 20)
    make_backend(policy, tokenizer).generate(PROMPTS, 2, sample(temperature=0.0, top_p=0.9))
    with pytest.raises(ValueError, match="below 0.01"):
        backend.generate(PROMPTS, 2, sample(temperature=0.005))


def test_temperature_above_two_is_refused_before_building_the_engine(vllm, policy, tokenizer):
    backend = make_backend(policy, tokenizer)
    with pytest.raises(ValueError, match="above 2.0"):
        backend.generate(PROMPTS, 2, sample(temperature=2.5))
    assert backend.llm is None
    backend.generate(PROMPTS, 2, sample(temperature=2.0))  # the limit itself is fine


def test_outputs_map_to_rows_masks_flags_and_sampling_logps(vllm, policy, tokenizer):
    backend = make_backend(policy, tokenizer)
    batch = backend.generate(PROMPTS, 3, sample(max_new_tokens=5, stop=["```"]))
    params = backend.llm.sampling_params[0][0]
    assert (params.temperature, params.top_k, params.max_tokens, params.stop, params.logprobs) == (1.0, 0, 5, ["```"], 0)
    assert params.include_stop_str_in_output and params.stop_token_ids == [tokenizer.eos_token_id]
    outputs = backend.llm.generate(backend.llm.prompts[0], backend.llm.sampling_params[0])  # same seeds: same draws
    for prompt, request in enumerate(outputs):
        for sample_ in sorted(request.outputs, key=lambda s: s.index):
            row = prompt * 3 + sample_.index
            length = len(sample_.token_ids)
            assert batch.completion_ids[row, :length].tolist() == sample_.token_ids
            assert batch.completion_mask[row].sum() == length
            assert bool(batch.truncated[row]) == (sample_.finish_reason == "length")
            expected = [vllm_stand_in.sampled_logprob(position) for position in range(length)]
            assert batch.sampling_logps[row, :length].tolist() == expected
            assert (batch.sampling_logps[row, length:] == 0).all()
    assert batch.sampling_logps.dtype == torch.float32 and batch.completion_ids.device == torch.device("cpu")


def test_without_the_correction_no_logprobs_are_asked(vllm, policy, tokenizer):
    backend = make_backend(policy, tokenizer, importance_sampling_correction=False)
    batch = backend.generate(PROMPTS, 2, sample())
    assert backend.llm.sampling_params[0][0].logprobs is None and batch.sampling_logps is None
    assert backend.importance_sampling_cap is None


def test_generation_runs_with_autocast_off(vllm, policy, tokenizer):
    backend = make_backend(policy, tokenizer)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        backend.generate(PROMPTS, 2, sample())
    assert backend.llm.autocast_during_generate == [False]


def test_a_prompt_too_long_for_max_model_len_is_a_clear_error(vllm, policy, tokenizer):
    backend = make_backend(policy, tokenizer, max_model_len=8)
    with pytest.raises(ValueError, match="max_model_len=8"):
        backend.generate(["def add(a, b):\n    return a + b"], 2, sample(max_new_tokens=6))


# ---- weight sync and sleep ----------------------------------------------------------------------
def pushes(llm) -> int:
    return sum(1 for event in llm.log if event == ("reset_prefix_cache",))


def test_weights_are_pushed_once_per_change_before_the_next_generate(vllm, policy, tokenizer):
    backend = make_backend(policy, tokenizer)
    backend.generate(PROMPTS, 2, sample())  # never synced: the engine holds the checkpoint from disk
    assert pushes(backend.llm) == 1
    backend.generate(PROMPTS, 2, sample())  # e.g. eval batches between two optimizer steps
    assert pushes(backend.llm) == 1
    backend.weights_changed()
    backend.weights_changed()  # num_iterations > 1, or a checkpoint load after a step: still one push
    backend.generate(PROMPTS, 2, sample())
    assert pushes(backend.llm) == 2
    assert set(backend.llm.model.tensors_per_call) == {1}  # streamed one tensor at a time
    names = [event[1] for event in backend.llm.log if event[0] == "load_weights"]
    assert names[: len(names) // 2] == [name for name, _ in policy.named_parameters()]


def test_sleep_mode_order(vllm, policy, tokenizer):
    backend = make_backend(policy, tokenizer, enable_sleep_mode=True)
    backend.generate(PROMPTS, 2, sample())
    backend.generate(PROMPTS, 2, sample())  # weights unchanged, but level 2 sleep discarded them
    events = [event if event[0] != "load_weights" else ("load_weights",) for event in backend.llm.log]
    events = [event for position, event in enumerate(events) if position == 0 or event != events[position - 1]]
    assert events == [
        ("build",), ("load_weights",), ("reset_prefix_cache",), ("generate",), ("sleep", 2),
        ("wake_up", ("weights",)), ("load_weights",), ("reset_prefix_cache",), ("wake_up", ("kv_cache",)),
        ("generate",), ("sleep", 2),
    ]


def test_grpo_pushes_a_loaded_checkpoint_before_its_next_generate(vllm, tmp_path):
    """rlcode validate/test with a checkpoint, and the eval callback's at-start eval on a resumed run:
    the weights that changed by loading a checkpoint reach the engine before it generates."""
    from rlcode.modes import GRPO
    from grpo_harness import learner

    module = learner(GRPO, model_name="tiny-random", rollout_backend="vllm", num_generations=2, max_new_tokens=4,
                  vllm={"max_model_len": 512})
    module.configure_model()
    module.generate(PROMPTS, 2, temperature=1.0, seed=0)  # engine synced with the starting weights
    engine = module.backend.llm.model.weights
    changed = {f"policy.{name}": tensor + 0.5 for name, tensor in module.policy.state_dict().items()}
    checkpoint = {"state_dict": changed}
    module.on_load_checkpoint(checkpoint)  # Lightning's order: the hook, then the state dict
    module.load_state_dict(checkpoint["state_dict"])
    assert not torch.equal(engine["model.norm.weight"], module.policy.model.norm.weight.detach())  # stale
    module.generate(PROMPTS, 2, temperature=1.0, seed=0)
    for name, parameter in module.policy.named_parameters():
        assert torch.equal(engine[name], parameter.detach()), name


def test_the_gpu_smoke_script_imports_and_explains_itself_on_cpu(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_vllm_smoke.py"
    spec = importlib.util.spec_from_file_location("gpu_vllm_smoke", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # no vllm, no CUDA needed to import it
    with pytest.raises(SystemExit) as exit_:
        script.parse_args(["--help"])
    assert exit_.value.code == 0 and "weights_changed()" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert script.main([]) == 2  # says it needs a GPU instead of failing obscurely


def test_the_pinned_vllm_range_is_the_one_the_code_names():
    import tomllib
    from pathlib import Path

    from rlcode.rollout.vllm.engine import TESTED_VLLM_VERSIONS

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["vllm"] == [f"vllm{TESTED_VLLM_VERSIONS}"]


# ---- the frozen opponent ----------------------------------------------------------------------------
def test_the_frozen_opponent_under_lora_and_vllm_is_the_starting_policy(vllm):
    """vLLM holds the merged policy, which switching adapters off does not change: the opponent samples
    the adapter-free base with transformers, never through the engine."""
    from rlcode.modes import SPIRAL
    from grpo_harness import learner
    from rlcode.rollout import HFGenerateBackend

    module = learner(SPIRAL, opponent="frozen", model_name="tiny-random", rollout_backend="vllm", lora={"r": 4},
                    max_new_tokens=6, temperature=1.0, vllm={"max_model_len": 512})
    module.configure_model()
    with torch.no_grad():  # a trained policy: adapters far from zero
        for name, parameter in module.policy.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(len(name))))
    module.generate(PROMPTS, 1, temperature=1.0, seed=0)  # the engine now holds the merged, trained policy
    opponent = module.mode.opponents.actor(module).generate  # the frozen player's generation (frozen_generator)
    played = opponent(PROMPTS, 4).completion_ids.tolist()

    base = HFGenerateBackend(load_model("tiny-random").eval(), module.tokenizer)
    expected = base.generate(PROMPTS, 1, module.sampling_params(4)).completion_ids.tolist()
    trained = HFGenerateBackend(module.policy, module.tokenizer).generate(PROMPTS, 1, module.sampling_params(4))
    assert played == expected
    assert trained.completion_ids.tolist() != expected  # the adapters change the samples: the test can fail
    assert sum(event == ("generate",) for event in module.backend.llm.log) == 1  # the engine played no opponent turn


def test_the_engine_refuses_to_generate_with_adapters_switched_off(vllm):
    policy = load_model("tiny-random", lora=LoraSettings(r=4))
    backend = make_backend(policy, load_tokenizer("tiny-random"))
    with policy.disable_adapter(), pytest.raises(RuntimeError, match="adapters switched off"):
        backend.generate(PROMPTS, 2, sample())
