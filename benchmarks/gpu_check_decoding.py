"""The GPU check's decoding checks (``gpu_check.py`` runs them beside ``gpu_check_cases.py``'s):

- ``generation``: rlcode's HF backend against transformers' ``generate()`` (the peer TRL uses) on the
  same 16 rows (4 prompts x 4) of up to 128 new tokens, bf16 weights, sampling at T 1 (``generate()``
  is held to all 128; the loop ends a row at a sampled EOS, so its tokens are counted): seconds each,
  and the loop's busiest operations (torch profiler, a few decode steps) when it is over 1.1x slower.
  Then the loop's decode step against its weight-streaming floor: a decode step reads every weight
  once, so it can take no less than the bf16 weight bytes over the HBM bandwidth (measured here, a 2 GiB
  device-to-device copy timed with CUDA events; in a dry run a CPU memcpy timed the same way):
  ``floor_ratio`` is the step's seconds over that floor at 16 rows (4 prompts x 4) and 64 rows (8 x 8,
  ~200-token prompts), the step taken as (k + 1 new tokens - 1 new token) / k so the prefill drops out,
  with EOS switched off so every row decodes every step. ``kernels_per_decode_step`` counts the CUDA
  kernels (torch profiler, the same difference over a few steps; null on a CPU, where
  ``aten_ops_per_decode_step`` is the count there is): a step far above its floor that launches many
  kernels waits on launches, not on memory. ``compile_s``: seconds torch.compile spent in this
  check (null: nothing was compiled).
- ``quantized_linears``: what ``model.rollout_precision`` could use on this GPU. rlcode's ``int8``
  sampler is CPU-only (torch's dynamic quantization has no CUDA kernels; the line records its refusal),
  so this times one decode step's linears of the model (28 layers' q/k/v/o/gate/up/down and the head,
  16 and 32 rows) in bf16 against torch's fp8 ``_scaled_mm`` (e4m3, per-row scales) and int8
  ``_int_mm`` (which needs more than 16 rows), each an available / error line, and their errors
  against bf16 on the same inputs: whether quantized weights would make GPU decoding faster at all.
"""

from __future__ import annotations

import sys
import time

from gpu_check_cases import SIZES, Setup, prompt_rows
from gpu_measure import free_memory, sync

FLOOR_ROWS = {16: "16x128", 64: "64x512"}  # rows -> the pair size whose prompts they decode after


def check_generation(setup: Setup) -> dict:
    """rlcode's decoding loop vs ``model.generate()`` on the same rows: seconds, and a profile of the loop."""
    import torch

    from rlcode.models import load_model, load_tokenizer
    from rlcode.rollout import SamplingParams, render_prompt
    from rlcode.rollout.hf_backend import HFGenerateBackend

    device = torch.device("cuda" if setup.cuda else "cpu")
    policy = load_model(str(setup.folder), precision="bf16-true").to(device).eval()
    tokenizer = load_tokenizer(str(setup.folder))
    prompts = [render_prompt(tokenizer, row["prompt"], chat=True) for row in prompt_rows(setup.prompts)]
    backend = HFGenerateBackend(policy, tokenizer)
    params = SamplingParams(temperature=1.0, seed=0, max_new_tokens=setup.max_new_tokens)
    tokenizer.padding_side = "left"
    encoded = tokenizer(prompts, padding=True, return_tensors="pt").to(device)
    paths = {"rlcode_loop": lambda: backend.generate(prompts, setup.generations, params),
             "generate": lambda: policy.generate(**encoded, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                                 num_return_sequences=setup.generations, min_new_tokens=setup.max_new_tokens,
                                                 max_new_tokens=setup.max_new_tokens, pad_token_id=tokenizer.pad_token_id)}
    result = {"rows": setup.prompts * setup.generations, "new_tokens": setup.max_new_tokens}
    with torch.no_grad():
        for name, path in [*paths.items(), *paths.items()]:  # the first of each warms up; the second is timed
            sync()
            started = time.perf_counter()
            output = path()
            sync()
            result[f"{name}_s"] = round(time.perf_counter() - started, 3)
            if name == "rlcode_loop":  # a random model may sample EOS: count what the loop decoded
                result["rlcode_loop_tokens"] = int(output.completion_mask.sum())
        result["rlcode_over_generate"] = round(result["rlcode_loop_s"] / result["generate_s"], 2)
        if result["rlcode_over_generate"] > 1.1:
            short = SamplingParams(temperature=1.0, seed=0, max_new_tokens=min(16, setup.max_new_tokens))
            activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if setup.cuda else [])
            with torch.profiler.profile(activities=activities) as profiler:
                backend.generate(prompts, setup.generations, short)
                sync()
            table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=48)
            print(table, flush=True)
            result["rlcode_loop_profile"] = table[-3000:]
    result.update(decode_floor(setup, policy, tokenizer, device))
    result["compile_s"] = compile_seconds()
    del backend, policy
    free_memory()
    return result


def decode_floor(setup: Setup, policy, tokenizer, device) -> dict:
    """The loop's seconds per decode step at 16 and 64 rows against bf16 weight bytes / copy bandwidth,
    and the kernels (on a CPU: aten ops) one decode step launches."""
    import torch

    from rlcode.rollout import SamplingParams, render_prompt
    from rlcode.rollout.hf_backend import HFGenerateBackend

    backend = HFGenerateBackend(policy, tokenizer, eos_token_ids=[-1])  # no id is -1: every row runs every step
    bandwidth = copy_bandwidth(device, setup.dry_run)
    weight_bytes = sum(p.numel() * p.element_size() for p in policy.parameters())  # a tied head counted once
    floor_s = weight_bytes / bandwidth
    result = {"copy_bandwidth_gb_s": round(bandwidth / 1e9, 1), "weight_gb": round(weight_bytes / 1e9, 3),
              "floor_ms": round(floor_s * 1000, 4), "decode_step_ms": {}, "floor_ratio": {}}
    steps = 2 if setup.dry_run else 32

    def run(prompts, group: int, new_tokens: int) -> float:
        sync()
        started = time.perf_counter()
        backend.generate(prompts, group, SamplingParams(temperature=1.0, seed=0, max_new_tokens=new_tokens))
        sync()
        return time.perf_counter() - started

    groups = {}
    with torch.no_grad():
        for rows, name in FLOOR_ROWS.items():
            full, size = SIZES[name], setup.size(name)  # the rows of the lease's size, the dry run's prompt length
            chats = prompt_rows(full.prompts, tokenizer if size.prompt_tokens else None, size.prompt_tokens)
            prompts = [render_prompt(tokenizer, row["prompt"], chat=True) for row in chats]
            groups[rows] = (prompts, full.generations)
            run(prompts, full.generations, steps + 1)  # warm-up
            one = min(run(prompts, full.generations, 1) for _ in range(2))
            many = min(run(prompts, full.generations, steps + 1) for _ in range(2))
            step_s = max(many - one, 0.0) / steps
            result["decode_step_ms"][str(rows)] = round(step_s * 1000, 3)
            result["floor_ratio"][str(rows)] = round(step_s / floor_s, 2)
        result.update(launches_per_decode_step(backend, *groups[16], device, steps=2 if setup.dry_run else 4))
    return result


def copy_bandwidth(device, dry_run: bool) -> float:
    """Bytes/s read + written by a large copy on ``device`` (best of a few; CUDA events on a GPU)."""
    import torch

    size = (64 if dry_run else 2048) * 2**20
    source = torch.empty(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)  # warm-up, and a CPU's pages touched
    best = float("inf")
    for _ in range(5):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            target.copy_(source)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000
        else:
            started = time.perf_counter()
            target.copy_(source)
            seconds = time.perf_counter() - started
        best = min(best, seconds)
    del source, target
    return 2 * size / best


def launches_per_decode_step(backend, prompts, group: int, device, steps: int) -> dict:
    """CUDA kernels (memcpy / memset left out) and aten ops per decode step: the profiler's counts over
    ``steps`` + 1 new tokens less those over 1."""
    import torch
    from torch.autograd import DeviceType

    from rlcode.rollout import SamplingParams

    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                          if device.type == "cuda" else [])

    def counts(new_tokens: int) -> tuple[int, int]:
        with torch.profiler.profile(activities=activities) as profiler:
            backend.generate(prompts, group, SamplingParams(temperature=1.0, seed=0, max_new_tokens=new_tokens))
            sync()
        events = profiler.events()
        kernels = sum(1 for e in events
                      if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset")))
        aten = sum(1 for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::"))
        return kernels, aten

    try:
        (kernels_one, aten_one), (kernels_many, aten_many) = counts(1), counts(steps + 1)
    except Exception as error:  # noqa: BLE001 - a profiler that cannot run here is an answer, not a failure
        return {"kernels_per_decode_step": None, "launches_note": f"profiler: {type(error).__name__}: {error}"[:300]}
    result = {"aten_ops_per_decode_step": round((aten_many - aten_one) / steps, 1)}
    if device.type == "cuda":
        result["kernels_per_decode_step"] = round((kernels_many - kernels_one) / steps, 1)
    else:
        result.update(kernels_per_decode_step=None,
                      launches_note="no CUDA device: aten ops (nested ones included) instead")
    return result


def compile_seconds() -> float | None:
    """Seconds torch.compile (dynamo and its backend) spent in this process; None when nothing was compiled."""
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import compilation_time_metrics, counters

    if not counters["stats"]["unique_graphs"]:
        return None
    return round(sum(compilation_time_metrics.get("_compile.compile_inner", [])), 2)


def check_quantized_linears(setup: Setup) -> dict:
    """One decode step's linears in bf16, fp8 (``torch._scaled_mm``) and int8 (``torch._int_mm``): time and error."""
    import torch

    from rlcode.rollout.quantized_sampler import device_refusal

    device = torch.device("cuda" if setup.cuda else "cpu")
    shape = setup.shape
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    kv = hidden // shape["num_attention_heads"] * shape["num_key_value_heads"]
    layer = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (inter, hidden), (inter, hidden),
             (hidden, inter)]  # (out, in) of q, k, v, o, gate, up, down
    shapes = layer * shape["num_hidden_layers"] + [(shape["vocab_size"], hidden)]
    generator = torch.Generator(device=device).manual_seed(0)
    weights = [torch.randn(out, inp, generator=generator, device=device, dtype=torch.bfloat16) * inp ** -0.5
               for out, inp in shapes]
    result = {"int8_sampler": device_refusal(device) or "runs here (CPU)",
              "weight_gb_bf16": round(sum(w.numel() for w in weights) * 2 / 2**30, 3)}

    def row_scales(t, largest: float):  # [rows, 1]: each row's absolute maximum maps to ``largest``
        return t.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / largest

    def fp8(w):
        scale = row_scales(w, 448.0)  # e4m3's largest finite value
        return (w.float() / scale).to(torch.float8_e4m3fn), scale.t().contiguous()

    def int8(w):
        scale = row_scales(w, 127.0)
        return (w.float() / scale).round().to(torch.int8).t().contiguous(), scale.t().contiguous()

    def run_fp8(x, packed):
        w8, w_scale = packed
        x_scale = row_scales(x, 448.0)
        x8 = (x.float() / x_scale).to(torch.float8_e4m3fn)
        return torch._scaled_mm(x8, w8.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=torch.bfloat16)

    def run_int8(x, packed):
        w8, w_scale = packed
        x_scale = row_scales(x, 127.0)
        x8 = (x.float() / x_scale).round().to(torch.int8)
        return (torch._int_mm(x8, w8).float() * x_scale * w_scale).to(torch.bfloat16)

    kinds = {"bf16": (lambda w: w, lambda x, w: torch.nn.functional.linear(x, w)),
             "fp8": (fp8, run_fp8), "int8": (int8, run_int8)}
    for rows in (16, 32):
        inputs = [torch.randn(rows, w.size(1), generator=generator, device=device, dtype=torch.bfloat16)
                  for w in weights]
        reference = None
        for kind, (pack, run) in kinds.items():
            key = f"{kind}_rows{rows}"
            try:
                packed = [pack(w) for w in weights]
                outputs = [run(x, p) for x, p in zip(inputs, packed)]  # warm-up, and the error below
                sync()
                repeats = 2 if setup.dry_run else 20
                started = time.perf_counter()
                for _ in range(repeats):
                    for x, p in zip(inputs, packed):
                        run(x, p)
                sync()
                result[f"{key}_ms"] = round((time.perf_counter() - started) / repeats * 1000, 3)
                if reference is None:
                    reference = outputs
                else:
                    errors = [((o.float() - r.float()).norm() / r.float().norm()).item() for o, r in zip(outputs, reference)]
                    result[f"{key}_relative_error"] = round(max(errors), 4)
                del packed, outputs
            except Exception as error:  # noqa: BLE001 - an unsupported kind is an answer, not a failure
                result[f"{key}_error"] = f"{type(error).__name__}: {error}"[:300]
        free_memory()
    return result


CHECKS = {"generation": check_generation, "quantized_linears": check_quantized_linears}
NEEDS_NO_MODEL = {"quantized_linears"}
