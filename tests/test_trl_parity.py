"""Parity of rlcode's GRPO-family loss with TRL 1.16 ``GRPOTrainer._compute_loss``.

One GRPOTrainer is built per module on a tiny random Qwen2 model with an offline word-level
tokenizer; each case sets the trainer's loss attributes, feeds both sides the same hand-made batch
(off-policy ``old_logps`` so clipping acts) and compares the loss and every parameter's gradient.
Our log-probs come from the production ``completion_logps`` (its chunked fused head, in chunks
smaller than the completions), TRL's from its own fused head (``_get_per_token_logps_and_entropies``).

Positions: TRL scores without ``position_ids`` (each row counts from its first pad), rlcode from
each row's first real token, as generation does. Qwen2's rotary attention sees only a constant
shift per row, to which it is invariant up to rounding (two more roundings per layer, inside the
bounds of ``float32_bounds`` that every comparison here uses: TRL computes its head in float32
whatever the model's dtype, so a float64 comparison is not possible); a model with absolute
positions would not agree (tests/test_sequence_logps.py covers that).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

from float32_bounds import TermMagnitudes, gamma, gradient_bound, logp_bound, reduction_depth  # noqa: E402
from rlcode.algorithms.advantages import group_advantages  # noqa: E402
from rlcode.logprobs import sequence_logps  # noqa: E402
from rlcode.algorithms.losses import LossTotals, policy_loss  # noqa: E402
from rlcode.logprobs.sequence_logps import completion_logps  # noqa: E402

TEMPERATURE = 0.7
MAX_COMPLETION_LENGTH = 8
EPSILON_LOW, EPSILON_HIGH = 0.2, 0.28
CHUNK = 3  # tokens per fused-head chunk: fewer than the 8-token completions, so chunks are exercised
WORDS = "def return if else for in range print x y z a b c = + - ( ) : 0 1 2 3".split()
PAD, EOS = 0, 1


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<eos>": EOS, "<unk>": 2, **{word: i + 3 for i, word in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from datasets import Dataset
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = _tiny_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=EOS, tie_word_embeddings=False,
    )
    model_dir = tmp_path_factory.mktemp("tiny_qwen2")
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl_out")),
        bf16=False,  # on CPU bf16=True would turn on autocast and break parity
        use_cpu=True,
        activation_checkpointing=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=MAX_COMPLETION_LENGTH,
        temperature=TEMPERATURE,
        epsilon=EPSILON_LOW,
        epsilon_high=EPSILON_HIGH,
        report_to=[],
    )
    dataset = Dataset.from_dict({"prompt": ["def f ( x ) :", "return x + 1", "for a in range", "print ( y )"]})
    built = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    built.model.train()  # TRL's train-mode normalisers are the ones a training step uses
    return built


def _batch():
    """Four completions: left-padded prompts, right-padded completions of lengths 8, 5, 3, 6."""
    prompt_ids = torch.tensor([[3, 4, 5], [PAD, 6, 7], [PAD, PAD, 8], [9, 10, 11]])
    completion_ids = torch.tensor([
        [12, 13, 14, 15, 16, 17, 18, 19],  # truncated: hit the token limit
        [20, 21, 22, 23, EOS, PAD, PAD, PAD],
        [24, 25, EOS, PAD, PAD, PAD, PAD, PAD],
        [3, 5, 7, 9, 11, EOS, PAD, PAD],
    ])
    return prompt_ids, (prompt_ids != PAD).long(), completion_ids, (completion_ids != PAD).long()


def _our_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, chunk_size=CHUNK):
    return completion_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, TEMPERATURE,
                            chunk_size=chunk_size)  # [B, T]


def _grads(model):
    return {name: param.grad.detach().clone() for name, param in model.named_parameters() if param.grad is not None}


def _plain_pass_bounds(model, batch, loss_of_logps):
    """Both sides compute in float32, each in its own order: the bounds of ``float32_bounds`` for
    this batch. The term magnitudes come from a plain pass (the model's own logits, log_softmax),
    whose backward of ``loss_of_logps`` reaches every parameter, the head included."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch
    input_ids, mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    terms = TermMagnitudes(model)
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=input_ids, attention_mask=mask,
                   position_ids=sequence_logps.position_ids(mask)).logits[:, prompt_ids.size(1) - 1:-1]
    z = logits / TEMPERATURE
    logps = torch.log_softmax(z, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1) * completion_mask
    loss_of_logps(logps).backward()
    terms.remove()
    model.zero_grad(set_to_none=True)
    depth = reduction_depth(model.config, input_ids.size(1))
    return logp_bound(z.detach(), depth), terms, depth


def _assert_gradients_within(ours, theirs, terms, depth, relative: float = 0.0) -> None:
    assert theirs.keys() == ours.keys() == terms.sums.keys() and theirs
    for name in theirs:
        bound = gradient_bound(terms, name, depth, relative)
        difference = (ours[name].double() - theirs[name].double()).abs()
        assert bool((difference <= bound).all()), f"{name}: {float((difference / bound).max()):.3g} of the bound"


@pytest.mark.parametrize("chunk_size", [CHUNK, None])
def test_completion_logps_and_gradients_match_trl(trainer, chunk_size):
    """The production ``completion_logps`` against TRL's own per-token log-probs on the same
    batch: values (0 on padding, as TRL) and every parameter's gradient of a weighted sum, within the
    bounds ``float32_bounds`` derives, with 3-token chunks and with the default chunk. Guards the
    fused head rlcode trains with."""
    model = trainer.model
    assert sequence_logps._fusable_head(model) is not None, "the fused path must be the one compared"
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    weights = torch.randn(completion_ids.shape, generator=torch.Generator().manual_seed(3))

    model.zero_grad(set_to_none=True)
    theirs, _, _ = trainer._get_per_token_logps_and_entropies(
        model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1),
        completion_ids.size(1))
    (theirs * weights).sum().backward()
    trl_grads = _grads(model)

    model.zero_grad(set_to_none=True)
    ours = _our_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, chunk_size)
    (ours * weights).sum().backward()
    our_grads = _grads(model)
    model.zero_grad(set_to_none=True)

    logps_diff = (ours - theirs).abs().max().item()
    assert trl_grads.keys() == our_grads.keys() and trl_grads
    grad_diff = max((our_grads[name] - trl_grads[name]).abs().max().item() for name in trl_grads)
    grad_scale = max(grad.abs().max().item() for grad in trl_grads.values())
    print(f"chunk={chunk_size} max|dlogp|={logps_diff:.2e} max|dgrad|={grad_diff:.2e} (max|grad|={grad_scale:.2e})")
    assert (theirs[completion_mask == 1] < 0).all() and (theirs[completion_mask == 0] == 0).all()
    batch = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    bound, terms, depth = _plain_pass_bounds(model, batch, lambda logps: (logps * weights).sum())
    assert logps_diff <= bound
    _assert_gradients_within(our_grads, trl_grads, terms, depth)
    assert grad_scale > 1e-3, "gradients must be non-trivial for the comparison to mean something"


CASES = [
    (loss_type, level, beta)
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo")
    for level in ("token", "sequence")
    for beta in (0.0, 0.04)
]


@pytest.mark.parametrize("accumulation_steps", [1, 2])
@pytest.mark.parametrize(("loss_type", "level", "beta"), CASES)
def test_loss_and_gradients_match_trl(trainer, loss_type, level, beta, accumulation_steps):
    model = trainer.model
    trainer.loss_type, trainer.importance_sampling_level, trainer.beta = loss_type, level, beta
    trainer.current_gradient_accumulation_steps = accumulation_steps
    # One generation batch per optimizer step: TRL's dapo normaliser is then the generation batch's count.
    trainer.args.steps_per_generation = accumulation_steps
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()

    with torch.no_grad():
        current = _our_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    generator = torch.Generator().manual_seed(1)
    # Per-row offsets push row 0 above 1 + eps_high (A > 0) and row 1 below 1 - eps_low (A < 0), at
    # token and sequence level alike; per-token noise varies the ratio inside each row.
    offsets = torch.tensor([[-0.4], [0.4], [0.3], [-0.1]])
    old_logps = current + offsets + 0.2 * torch.randn(current.shape, generator=generator)
    ref_logps = current + 0.3 * torch.randn(current.shape, generator=generator)
    advantages, _ = group_advantages(torch.tensor([1.0, 0.0, 0.7, 0.2]), group_size=4)
    assert (advantages[[0, 2]] > 0).all() and (advantages[[1, 3]] < 0).all()
    # As if this micro-batch were part of a larger generation batch: dapo must use this count.
    num_items_in_batch = torch.tensor(float(completion_mask.sum() * 2 + 3))
    inputs = {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
        "completion_ids": completion_ids, "completion_mask": completion_mask,
        "advantages": advantages, "num_items_in_batch": num_items_in_batch,
        "old_per_token_logps": old_logps, "ref_per_token_logps": ref_logps,
    }

    model.zero_grad(set_to_none=True)
    trl_loss = trainer._compute_loss(model, inputs)
    trl_loss.backward()
    trl_grads = _grads(model)

    model.zero_grad(set_to_none=True)
    logps = _our_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    # TRL normalises grpo, bnpo and dr_grpo per micro-batch and divides by the accumulation steps;
    # with equal micro-batches that is rlcode's step totals of accumulation_steps such micro-batches.
    # dapo divides by num_items_in_batch, the generation batch's token count.
    tokens = float(num_items_in_batch) if loss_type == "dapo" else float(completion_mask.sum()) * accumulation_steps
    totals = LossTotals(tokens=tokens, sequences=completion_mask.size(0) * accumulation_steps)
    our_loss, parts = policy_loss(
        logps, advantages, completion_mask, old_logps, ref_logps if beta else None,
        loss_type=loss_type, epsilon_low=EPSILON_LOW, epsilon_high=EPSILON_HIGH, beta=beta,
        importance_sampling_level=level, max_completion_length=MAX_COMPLETION_LENGTH, totals=totals,
    )
    our_loss.backward()
    our_grads = _grads(model)
    model.zero_grad(set_to_none=True)

    assert parts.clip_frac_region > 0, "the batch must exercise clipping"
    loss_diff = (our_loss - trl_loss).abs().item()
    assert trl_grads.keys() == our_grads.keys() and trl_grads
    grad_diff = max((our_grads[name] - trl_grads[name]).abs().max().item() for name in trl_grads)
    grad_scale = max(grad.abs().max().item() for grad in trl_grads.values())
    print(f"{loss_type:8s} {level:8s} beta={beta:<5} accum={accumulation_steps} loss={trl_loss.item():+.6f} "
          f"|dloss|={loss_diff:.2e} max|dgrad|={grad_diff:.2e} (max|grad|={grad_scale:.2e})")
    # Bounds: the log-probs each side computes differ by at most ``bound`` (float32_bounds), which
    # moves a ratio r = exp(logp - old) by that much relatively and each token's term by at most
    # max |d term / d logp| x bound; the loss is a mean of those terms (weights summing to <= 1),
    # rounded within gamma(N + 8) of their size. The gradients get the same relative shift.
    batch = (prompt_ids, prompt_mask, completion_ids, completion_mask)

    def our_loss_of(plain_logps):
        return policy_loss(plain_logps, advantages, completion_mask, old_logps, ref_logps if beta else None,
                           loss_type=loss_type, epsilon_low=EPSILON_LOW, epsilon_high=EPSILON_HIGH, beta=beta,
                           importance_sampling_level=level, max_completion_length=MAX_COMPLETION_LENGTH,
                           totals=totals)[0]

    bound, terms, depth = _plain_pass_bounds(model, batch, our_loss_of)
    with torch.no_grad():
        active = completion_mask.bool()
        ratio = torch.exp(logps - old_logps).clamp(min=1 + EPSILON_HIGH)  # token level; sequence level is a mean's exp
        ratio = torch.maximum(ratio, torch.exp(((logps - old_logps) * completion_mask).sum(1, keepdim=True)
                                               / completion_mask.sum(1, keepdim=True)))
        d = ref_logps - logps
        k3 = torch.exp(d) - d - 1
        size = ratio * (advantages.abs().unsqueeze(1) + beta * (k3 + torch.exp(d) + 1))  # |term|, |d term / d logp|
        size = float(size[active].max())
    assert loss_diff <= (2 * gamma(completion_mask.numel() + 8) + 2 * bound) * size
    _assert_gradients_within(our_grads, trl_grads, terms, depth, relative=bound)
    assert grad_scale > 1e-4, "gradients must be non-trivial for the comparison to mean something"


def test_logged_parts_match_trl_metrics(trainer):
    """Clip fractions and KL agree with what TRL logs for the same batch."""
    model = trainer.model
    trainer.loss_type, trainer.importance_sampling_level, trainer.beta = "dapo", "token", 0.04
    trainer.current_gradient_accumulation_steps = 1
    trainer.args.steps_per_generation = 1
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    with torch.no_grad():
        current = _our_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
        generator = torch.Generator().manual_seed(2)
        old_logps = current + 0.3 * torch.randn(current.shape, generator=generator)
        ref_logps = current + 0.3 * torch.randn(current.shape, generator=generator)
        advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
        trainer._metrics["train"].clear()
        trainer._compute_loss(model, {
            "prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
            "completion_ids": completion_ids, "completion_mask": completion_mask,
            "advantages": advantages, "num_items_in_batch": completion_mask.sum(),
            "old_per_token_logps": old_logps, "ref_per_token_logps": ref_logps,
        })
        _, parts = policy_loss(current, advantages, completion_mask, old_logps, ref_logps,
                               epsilon_low=EPSILON_LOW, epsilon_high=EPSILON_HIGH, beta=0.04)
    logged = trainer._metrics["train"]
    assert parts.clip_frac_region > 0
    tokens = int(completion_mask.sum())
    for ours, theirs in ((parts.kl, "kl"), (parts.clip_frac_low, "clip_ratio/low_mean"),
                         (parts.clip_frac_high, "clip_ratio/high_mean"),
                         (parts.clip_frac_region, "clip_ratio/region_mean")):
        # means over the tokens of non-negative terms (k3 x ratio, 0/1 clip flags): no cancellation,
        # so the sum of their sizes is the mean itself
        bound = _float32_bound(tokens, abs(ours.item()))
        assert ours.item() == pytest.approx(logged[theirs][-1], abs=bound), theirs


def _float32_bound(terms: int, size: float) -> float:
    """How far two float32 evaluations of one mean can lie apart: each is a sum of ``terms`` terms
    whose sizes add up to ``size`` x ``terms``, rounded once per addition in any order (within
    gamma(terms) of exact, Higham 3.1), then through at most 8 further roundings (scales, division,
    square root); u = 2^-24."""
    return 2 * (terms + 8) * 2.0**-24 * size


@pytest.fixture(scope="module")
def scoring_trainer(tmp_path_factory):
    """A GRPOTrainer whose reward function returns preset rewards, to read TRL's advantages."""
    from datasets import Dataset
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = _tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=EOS,
    )
    preset_rewards: list[float | None] = []
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl_scoring")), bf16=False, use_cpu=True,
        activation_checkpointing=False, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=2, report_to=[],
    )
    built = GRPOTrainer(
        model=Qwen2ForCausalLM(config),
        reward_funcs=lambda completions, **kwargs: list(preset_rewards),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["def f", "return x"]}),
        processing_class=tokenizer,
    )
    built.preset_rewards = preset_rewards
    return built


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize(
    "rewards",
    [
        [1.0, 0.0, 0.5, 0.25, 2.0, 2.0, 2.0, 2.0],  # one flat group
        [1.0, None, 0.0, 1.0, 3.0, 3.0, None, 3.5],  # unscorable completions (None -> NaN)
        [0.1, 0.9, 0.4, 0.7, -1.0, 2.5, 0.0, 1.0],
    ],
)
def test_advantages_match_trl(scoring_trainer, rewards, scale_rewards):
    scoring_trainer.scale_rewards = scale_rewards
    scoring_trainer.preset_rewards[:] = rewards
    scoring_trainer._metrics["train"].clear()
    rows = [{"prompt": "def f"}] * 4 + [{"prompt": "return x"}] * 4
    with torch.no_grad():
        theirs = scoring_trainer._generate_and_score_completions(rows)["advantages"]
    as_tensor = torch.tensor([float("nan") if r is None else r for r in rewards])
    ours, stats = group_advantages(as_tensor, group_size=4, scale_rewards=scale_rewards)
    # A = (r - mean) / (std + eps) in float32 on both sides: the deviation carries the rounding of
    # rewards of size R (R / divisor once divided), the rest that of A itself. The divisor, from
    # the exact float64 advantages, is the smallest this batch divides by.
    exact, _ = group_advantages(as_tensor.double(), group_size=4, scale_rewards=scale_rewards)
    grouped = as_tensor.double().view(-1, 4)
    deviation = as_tensor.double() - torch.nanmean(grouped, 1).repeat_interleave(4)
    moved = exact != 0
    divisor = float((deviation[moved] / exact[moved]).abs().min()) if moved.any() else 1.0
    size = float(as_tensor.nan_to_num().abs().max())
    difference = (ours - theirs).abs().max().item()
    print(f"advantages {scale_rewards:5s} {rewards}: max|diff|={difference:.2e}")
    assert difference <= _float32_bound(8, size / divisor + float(exact.abs().max()))
    logged = scoring_trainer._metrics["train"]
    assert stats.reward_mean.item() == pytest.approx(logged["reward"][-1], abs=_float32_bound(8, size))
    assert stats.reward_std.item() == pytest.approx(logged["reward_std"][-1], abs=_float32_bound(16, size))
    if scale_rewards != "batch":  # TRL logs, in batch mode, whether the *batch* std is zero
        assert stats.frac_reward_zero_std.item() == pytest.approx(logged["frac_reward_zero_std"][-1])
