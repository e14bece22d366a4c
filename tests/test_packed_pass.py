"""The packed training pass: the layout of a micro-batch as one sequence, and log-probs and every
parameter gradient equal to the plain pass, for groups, distinct prompts and multi-turn histories,
from exactly one decoder call.

The equalities run in float64, where the two passes agree to rounding (``exact_float64``); one
float32 case checks the same against bounds derived from float32 rounding (``float32_bounds``)."""

from __future__ import annotations

import logging

import pytest
import torch

from exact_float64 import assert_float64_equal, in_float64
from float32_bounds import TermMagnitudes, gradient_bound, logp_bound, reduction_depth
from grpo_harness import GradientRecorder, assert_same_gradients, build_module, fit_steps
from rlcode.logprobs import sequence_logps
from rlcode.logprobs.packed_pass import attention_mask, packed_layout, packed_pass_support, row_tokens
from rlcode.logprobs.prefix_tree import prefix_tree
from rlcode.logprobs.sequence_logps import completion_logps

TEMPERATURE = 0.7
VOCAB = 300


# ---- the prompt tree and the layout ----------------------------------------------------------------
def _paths(tree) -> list[list[int]]:
    """Each row's prompt rebuilt from the segments on its path."""
    prompts = []
    for depth, node in tree.row_ends:
        tokens: list[int] = []
        while depth >= 0:
            level = tree.levels[depth]
            tokens = level.segments[node] + tokens
            node, depth = level.parents[node], depth - 1
        prompts.append(tokens)
    return prompts


def test_tree_holds_each_shared_run_once_and_rebuilds_every_prompt():
    system, a, b = [1, 2, 3], [4, 5], [6, 7, 8]
    turn1 = system + a
    turn2 = turn1 + [9, 10] + b  # a later turn: the history plus its reply and feedback
    prompts = [turn1, turn1, system + b, turn2, turn1]
    tree = prefix_tree(prompts)
    assert _paths(tree) == prompts
    assert [level.segments for level in tree.levels] == [[system], [a, b], [[9, 10] + b]]
    assert tree.tokens == len(system) + len(a) + len(b) + 5
    assert tree.row_ends[0] == tree.row_ends[1] == tree.row_ends[4]  # one node for the group
    assert [level.offsets for level in tree.levels] == [[0], [3, 3], [5]]


def test_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="empty prompt"):
        prefix_tree([[1], []])


def test_layout_of_a_group_and_a_later_turn():
    """A group of two rows on one prompt and a row whose prompt extends it: each prompt token once,
    completions after their prompt (last token not fed), positions along each row's own path, and a
    mask where siblings do not see each other."""
    prompts = [[1, 2, 3], [1, 2, 3], [1, 2, 3, 4, 5]]
    completions = [[10, 11, 12], [20], [30, 31]]
    layout = packed_layout(prompts, completions, torch.device("cpu"))
    # segments: [1 2 3] (0), row 0's [10 11] (1), row 1's nothing (it has one token), [4 5] (2), row 2's [30] (3)
    assert layout.input_ids.tolist() == [[1, 2, 3, 10, 11, 4, 5, 30]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 4, 5]]
    assert layout.segment_ids.tolist() == [0, 0, 0, 1, 1, 2, 2, 3]
    # row 0's tokens are predicted at 2 (last prompt token), 3, 4; row 1's at 2; row 2's at 6, 7
    assert layout.predicting.tolist() == [2, 3, 4, 2, 6, 7]
    model = _tiny("Llama")
    sees = attention_mask(layout, model, torch.float32)[0, 0]
    assert sees.dtype == torch.bool
    assert sees[4].tolist() == [True, True, True, True, True, False, False, False]  # row 0: prompt + itself
    assert sees[7].tolist() == [True, True, True, False, False, True, True, True]  # row 2: not row 0's completion
    assert sees[5].tolist() == [True, True, True, False, False, True, False, False]


def test_row_tokens_reads_real_tokens_and_refuses_other_padding():
    prompt_ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    completion_ids = torch.tensor([[1, 2, 0], [3, 0, 0]])
    completion_mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert row_tokens(prompt_ids, prompt_mask, completion_ids, completion_mask) == ([[5, 6], [7, 8, 9]], [[1, 2], [3]])
    holed = torch.tensor([[1, 0, 1], [1, 0, 0]])
    assert row_tokens(prompt_ids, prompt_mask, completion_ids, holed) is None
    right_padded_prompts = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert row_tokens(prompt_ids, right_padded_prompts, completion_ids, completion_mask) is None


# ---- log-probs and gradients against the plain pass -----------------------------------------------
def _tiny(architecture: str, attention: str = "sdpa", **extra):
    import transformers

    config = getattr(transformers, f"{architecture}Config")(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128, pad_token_id=0, **extra)
    config._attn_implementation = attention
    torch.manual_seed(0)
    return getattr(transformers, f"{architecture}ForCausalLM")(config).train()


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)  # learned absolute positions: a wrong position id changes every log-prob
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=128,
                                      bos_token_id=1, eos_token_id=1, resid_pdrop=0, embd_pdrop=0,
                                      attn_pdrop=0)).train()


def _lora():
    from rlcode.models.adapters import LoraSettings, apply_lora

    model = apply_lora(_tiny("Qwen2", tie_word_embeddings=False), LoraSettings(r=4, dropout=0.0),
                       quantized=False, gradient_checkpointing=False)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: make the adapters matter
            torch.nn.init.normal_(parameter, std=0.1, generator=torch.Generator().manual_seed(2))
    return model


MODELS = {
    "llama": lambda: _tiny("Llama"),
    "qwen2-tied": lambda: _tiny("Qwen2", tie_word_embeddings=True),
    "phi-head-bias": lambda: _tiny("Phi"),
    "gpt2": _gpt2,
    "lora": _lora,
}


def _random(generator, length: int) -> list[int]:
    return torch.randint(1, VOCAB, (length,), generator=generator).tolist()


def _prompts(case: str) -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    system = _random(generator, 6)  # a chat template's system block: every prompt starts with it
    if case == "groups-of-8":  # 3 prompts of different lengths, G = 8: left padding of 0, 5, 9 tokens
        distinct = [system + _random(generator, n) for n in (12, 7, 3)]
        return [prompt for prompt in distinct for _ in range(8)]
    if case == "G=1":
        return [system + _random(generator, n) for n in (9, 4, 6)]
    # multi-turn (SPIRAL's turn samples): 2 episodes of 3 turns; each turn's context is the previous
    # one plus reply and feedback, so the rows share histories of different lengths.
    first = system + _random(generator, 5)
    rows = []
    for _episode in range(2):
        context = first
        for turn in range(3):
            rows.append(context)
            context = context + _random(generator, 4 + turn)
    return rows


def _batch(prompts: list[list[int]], generator_seed: int = 4):
    """Left-padded prompts and right-padded completions of 1..7 tokens (one row of none)."""
    generator = torch.Generator().manual_seed(generator_seed)
    width, rows, length = max(map(len, prompts)), len(prompts), 7
    prompt_ids = torch.zeros(rows, width, dtype=torch.long)
    prompt_mask = torch.zeros(rows, width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        prompt_ids[row, width - len(prompt):] = torch.tensor(prompt)
        prompt_mask[row, width - len(prompt):] = 1
    lengths = torch.tensor([1 + (row * 3) % length for row in range(rows)])
    lengths[-1] = 0  # a row with no completion token (a dummy row of the update has one)
    completion_mask = (torch.arange(length) < lengths.unsqueeze(1)).long()
    completion_ids = torch.randint(1, VOCAB, (rows, length), generator=generator) * completion_mask
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def _logps_and_grads(model, batch, share_prefix: bool):
    dtype = next(model.parameters()).dtype
    weights = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    model.zero_grad(set_to_none=True)
    logps = completion_logps(model, *batch, TEMPERATURE, share_prefix=share_prefix)
    (logps * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return logps.detach(), grads


class _Spy:
    """Counts packed passes, decoder calls (forward calls of the input embedding) and the token
    positions they ran."""

    def __init__(self, model, monkeypatch) -> None:
        self.packed_calls, self.decoder_calls, self.positions = 0, 0, 0
        original = sequence_logps.packed_outputs

        def packed(*args, **kwargs):
            self.packed_calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(sequence_logps, "packed_outputs", packed)
        model.get_input_embeddings().register_forward_hook(self._count)

    def _count(self, module, inputs, output) -> None:
        self.decoder_calls += 1
        self.positions += inputs[0].numel()


def _assert_float64_same(packed, plain) -> None:
    assert_float64_equal(packed[0], plain[0], "log-probs")
    assert packed[1].keys() == plain[1].keys() and any(bool(g.abs().max() > 0) for g in plain[1].values())
    for name in plain[1]:
        assert_float64_equal(packed[1][name], plain[1][name], name)


@pytest.mark.parametrize("case", ["groups-of-8", "G=1", "multi-turn"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_packed_pass_equals_the_plain_pass_in_one_call(name, case, monkeypatch):
    """Log-probs and every trained parameter's gradient equal the plain pass in float64 (to
    rounding: ``exact_float64``), from one decoder call over fewer token positions."""
    model = in_float64(MODELS[name]())
    batch = _batch(_prompts(case))
    spy = _Spy(model, monkeypatch)
    plain = _logps_and_grads(model, batch, share_prefix=False)
    plain_positions, spy.positions, spy.decoder_calls = spy.positions, 0, 0
    packed = _logps_and_grads(model, batch, share_prefix=True)
    assert spy.packed_calls == 1, "the packed pass must have run"
    assert spy.decoder_calls == 1, "one decoder call per micro-batch"
    assert spy.positions < plain_positions
    assert plain[0].abs().sum() > 0
    _assert_float64_same(packed, plain)


def test_eager_attention_takes_the_same_rule_as_an_additive_mask():
    """Eager attention adds the mask to its scores: 0 where SDPA's boolean mask attends, the dtype's
    lowest value elsewhere. (The rule itself is what the SDPA tests above check end to end; eager's
    own softmax runs in float32, so a float64 comparison of whole passes would measure that.)"""
    layout = packed_layout([[1, 2, 3], [1, 2, 3], [1, 2, 3, 4, 5]], [[10, 11, 12], [20], [30, 31]],
                           torch.device("cpu"))
    sees = attention_mask(layout, _tiny("Llama"), torch.float64)
    additive = attention_mask(layout, _tiny("Llama", attention="eager"), torch.float64)
    assert additive.dtype == torch.float64 and additive.shape == sees.shape
    expected = torch.zeros(sees.shape, dtype=torch.float64).masked_fill(~sees, torch.finfo(torch.float64).min)
    assert torch.equal(additive, expected)


def _assert_packs_like_plain(model, monkeypatch) -> None:
    model = in_float64(model)
    batch = _batch(_prompts("multi-turn"))
    spy = _Spy(model, monkeypatch)
    plain = _logps_and_grads(model, batch, share_prefix=False)
    packed = _logps_and_grads(model, batch, share_prefix=True)
    assert spy.packed_calls == 1
    _assert_float64_same(packed, plain)


def test_plain_head_path_packs_too(monkeypatch):
    """A head that cannot be fused (the model's own logits, on the packed positions only)."""
    monkeypatch.setattr(sequence_logps, "_fusable_head", lambda model: None)
    _assert_packs_like_plain(_tiny("Qwen2", tie_word_embeddings=False), monkeypatch)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("case", ["groups-of-8", "multi-turn"])
@pytest.mark.parametrize("name", ["llama", "lora"])
def test_packed_pass_with_gradient_checkpointing_equals_the_plain_pass(name, case, reentrant, monkeypatch):
    """No cache crosses calls, so either kind of checkpointing replays the one call: the log-probs and
    gradients equal the plain pass without checkpointing, in float64, and every layer ran again."""
    model = in_float64(MODELS[name]())
    batch = _batch(_prompts(case))
    plain = _logps_and_grads(model, batch, share_prefix=False)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    if name == "lora" or reentrant:
        model.enable_input_require_grads()  # what peft's preparation does for checkpointing with frozen embeddings
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]
    recomputed = []
    for layer in layers:  # a module inside: transformers checkpoints the layer's forward, inside its hooks
        next(layer.children()).register_forward_hook(lambda module, inputs, output: recomputed.append(1))
    spy = _Spy(model, monkeypatch)
    packed = _logps_and_grads(model, batch, share_prefix=True)
    assert spy.packed_calls == 1 and spy.decoder_calls == 1
    assert len(recomputed) == 2 * len(layers)  # every layer ran again in backward
    _assert_float64_same(packed, plain)


# ---- one float32 case, against a bound derived from float32 rounding -----------------------------
def test_float32_packed_pass_is_within_the_rounding_bound(monkeypatch):
    """The LoRA model, three distinct prompts, float32: log-probs and every gradient within the
    bounds ``float32_bounds`` derives from float32 rounding, the reduction lengths and the terms'
    magnitudes. A wrong position id or a row seeing its sibling still exceeds them; the float64
    tests catch every smaller defect."""
    model = _lora()
    batch = _batch(_prompts("G=1"))
    spy = _Spy(model, monkeypatch)
    terms = TermMagnitudes(model)
    plain = _logps_and_grads(model, batch, share_prefix=False)
    terms.remove()
    packed = _logps_and_grads(model, batch, share_prefix=True)
    assert spy.packed_calls == 1 and plain[0].dtype == torch.float32

    inputs = torch.cat([batch[0], batch[2]], 1), torch.cat([batch[1], batch[3]], 1)
    depth = reduction_depth(model.get_base_model().config, inputs[0].size(1))
    with torch.no_grad():
        logits = model(input_ids=inputs[0], attention_mask=inputs[1],
                       position_ids=sequence_logps.position_ids(inputs[1])).logits
    torch.testing.assert_close(packed[0], plain[0], atol=logp_bound(logits / TEMPERATURE, depth), rtol=0)

    assert plain[1].keys() == terms.sums.keys() and terms.positions == inputs[0].numel()
    for name, plain_grad in plain[1].items():
        bound = gradient_bound(terms, name, depth)
        difference = (packed[1][name].double() - plain_grad.double()).abs()
        assert bool((difference <= bound).all()), f"{name}: {float((difference / bound).max()):.3g} of the bound"
        assert bool(plain_grad.abs().max() > 0) and bool((bound < 1e-2 * plain_grad.abs().max()).all())


# ---- what cannot be packed --------------------------------------------------------------------------
def test_sliding_window_shorter_than_a_row_runs_the_plain_pass_and_says_why(monkeypatch, caplog):
    model = _tiny("Mistral", sliding_window=4)
    monkeypatch.setattr(sequence_logps, "_reported", set())
    batch = _batch(_prompts("groups-of-8"))
    spy = _Spy(model, monkeypatch)
    with caplog.at_level(logging.WARNING, logger=sequence_logps.__name__):
        packed = _logps_and_grads(model, batch, share_prefix=True)
        _logps_and_grads(model, batch, share_prefix=True)
    assert spy.packed_calls == 0
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1 and "sliding window of 4" in messages[0], messages
    plain = _logps_and_grads(model, batch, share_prefix=False)
    torch.testing.assert_close(packed[0], plain[0], atol=0, rtol=0)  # the very same computation


def test_sliding_window_longer_than_every_row_packs(monkeypatch):
    _assert_packs_like_plain(_tiny("Mistral", sliding_window=64), monkeypatch)


def test_attention_without_a_mask_argument_is_refused_by_name():
    model = _tiny("Llama")
    model.config._attn_implementation = "flash_attention_2"
    reason = packed_pass_support(model, 10)
    assert reason is not None and "'flash_attention_2'" in reason and "sdpa" in reason
    assert packed_pass_support(_tiny("Llama"), 10) is None


def test_flex_attention_gets_a_block_mask_of_the_same_rule():
    """FlexAttention's block mask (what a GPU runs) admits exactly the dense mask's pairs."""
    layout = packed_layout([[1, 2, 3], [1, 2, 3], [1, 2, 3, 4, 5]], [[10, 11, 12], [20], [30, 31]],
                           torch.device("cpu"))
    dense = attention_mask(layout, _tiny("Llama"), torch.float32)[0, 0]
    block = attention_mask(layout, _tiny("Llama", attention="flex_attention"), torch.float32)
    rule = block.mask_mod
    pairs = torch.tensor([[bool(rule(0, 0, torch.tensor(q), torch.tensor(k))) for k in range(layout.length)]
                          for q in range(layout.length)])
    assert torch.equal(pairs, dense)


def test_grpo_step_gradients_are_the_same_packed_and_plain(monkeypatch):
    """A whole GRPO step (micro-batches of 3 rows over groups of 4) on the tiny model, in float64,
    with one decoder call per micro-batch."""
    calls = []
    original = sequence_logps.packed_outputs
    monkeypatch.setattr(sequence_logps, "packed_outputs", lambda *a, **k: calls.append(1) or original(*a, **k))
    updates = {}
    for share in (False, True):
        recorder = GradientRecorder()
        fit_steps(build_module(share_prefix=share, micro_batch_size=3, float64=True), callbacks=[recorder])
        updates[share] = recorder.updates[0]
    assert calls, "the packed pass must have run in the step"
    assert_same_gradients(updates[True], updates[False])
