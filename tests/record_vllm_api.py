"""Record, from a vllm wheel's own source, what the strict stand-in (``vllm_stand_in.py``) enforces.

vLLM needs CUDA, so the tests run the vLLM backend against a stand-in. A stand-in that accepts any
keyword or weight name cannot catch a misspelt engine argument or a weight vLLM would refuse; this
script reads the real API from the wheel with ``ast`` (nothing is imported or installed) and writes
it as data, ``vllm_api.json`` beside this file:

- the keywords ``LLM()`` accepts (its own parameters plus the ``EngineArgs`` fields its ``**kwargs``
  go to), ``LLM.generate``/``sleep``/``wake_up``/``reset_prefix_cache`` parameters, the public
  fields of ``SamplingParams`` and the keys of ``TokensPrompt``;
- the literal values of ``logprobs_mode`` and ``distributed_executor_backend``;
- the sampling constants (``temperature`` range, the minimum temperature it raises smaller ones to);
- the weight-name rules of the model classes the tests use: the stacked (fused) q/k/v and gate/up
  projections of ``hf_to_vllm_mapper``, the tied ``lm_head`` alias, and the names it drops;
- the torch / transformers versions the wheel requires.

Regenerate (about 340 MB download, seconds to parse):

    pip download vllm==0.33.0 --no-deps -d WHEEL_DIR
    python tests/record_vllm_api.py WHEEL_DIR/vllm-0.33.0-*.whl
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import zipfile
from pathlib import Path

OUTPUT = Path(__file__).with_name("vllm_api.json")
ARCHITECTURES = {  # HF architecture -> (vLLM module, body class holding the mapper, causal-LM class)
    "Qwen2ForCausalLM": ("vllm/model_executor/models/qwen2.py", "Qwen2Model", "Qwen2ForCausalLM"),
    "LlamaForCausalLM": ("vllm/model_executor/models/llama.py", "LlamaModel", "LlamaForCausalLM"),
}


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise LookupError(f"class {name} not found")


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"{cls.name}.{name} not found")


def _fields(cls: ast.ClassDef, public_only: bool = True) -> list[str]:
    """Annotated class attributes (dataclass / msgspec / TypedDict fields), in order."""
    names = [node.target.id for node in cls.body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)]
    return [name for name in names if not (public_only and name.startswith("_"))]


def _parameters(function: ast.FunctionDef) -> list[str]:
    arguments = function.args
    names = [arg.arg for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]
    return [name for name in names if name != "self"]


def _literal_alias(tree: ast.Module, name: str) -> list[str]:
    """``Name = Literal["a", "b"]`` -> ["a", "b"]."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
            elements = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
            return [element.value for element in elements]
    raise LookupError(name)


def _constant(tree: ast.Module, name: str):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(name)


def _temperature_maximum(sampling: ast.Module) -> float:
    """The bound of ``if self.temperature > X: raise`` in ``SamplingParams._verify_args``."""
    verify = _method(_class(sampling, "SamplingParams"), "_verify_args")
    for node in ast.walk(verify):
        if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "temperature"
                and isinstance(node.ops[0], ast.Gt)):
            return float(ast.literal_eval(node.comparators[0]))
    raise LookupError("temperature maximum")


def _stacked_mapping(tree: ast.Module, body_class: str) -> dict[str, list]:
    """``hf_to_vllm_mapper = WeightsMapper(orig_to_new_stacked={".q_proj": (".qkv_proj", "q"), ...})``."""
    for node in _class(tree, body_class).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "hf_to_vllm_mapper" for t in node.targets):
            for keyword in node.value.keywords:
                if keyword.arg == "orig_to_new_stacked":
                    return {key: list(value) for key, value in ast.literal_eval(keyword.value).items()}
    raise LookupError(f"{body_class}.hf_to_vllm_mapper")


def _ties_lm_head(tree: ast.Module, causal_class: str) -> str | None:
    """The module ``lm_head`` is tied to under ``config.tie_word_embeddings``, e.g. ``model.embed_tokens``."""
    init = _method(_class(tree, causal_class), "__init__")
    for node in ast.walk(init):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "tie_weights"
                and node.args):
            return ast.unparse(node.args[0]).removeprefix("self.")
    return None


def _dropped_substrings(utils: ast.Module) -> list[str]:
    """Names ``AutoWeightsLoader`` drops before loading (its rotary-embedding mapper)."""
    loader = _class(utils, "AutoWeightsLoader")
    for node in loader.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "REMOVE_UNUSED_ROTARY_EMBEDS_MAPPER":
            mapping = ast.literal_eval(node.value.keywords[0].value)
            return [key for key, value in mapping.items() if value is None]
    raise LookupError("REMOVE_UNUSED_ROTARY_EMBEDS_MAPPER")


def _requirement(metadata: str, package: str) -> str:
    match = re.search(rf"^Requires-Dist: {package}([^;\n]*)$", metadata, re.MULTILINE)
    return match.group(1).strip() if match else ""


def record(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as archive:
        def parsed(path: str) -> ast.Module:
            return ast.parse(archive.read(path).decode())

        metadata_path = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        metadata = archive.read(metadata_path).decode()
        arg_utils, llm = parsed("vllm/engine/arg_utils.py"), parsed("vllm/entrypoints/llm.py")
        sampling, inputs = parsed("vllm/sampling_params.py"), parsed("vllm/inputs/llm.py")
        model_config, parallel = parsed("vllm/config/model.py"), parsed("vllm/config/parallel.py")
        utils = parsed("vllm/model_executor/models/utils.py")
        llm_class = _class(llm, "LLM")
        weight_rules = {}
        for architecture, (path, body_class, causal_class) in ARCHITECTURES.items():
            tree = parsed(path)
            tied_to = _ties_lm_head(tree, causal_class)
            weight_rules[architecture] = {
                "stacked": _stacked_mapping(tree, body_class),
                "tied_aliases": {"lm_head.weight": f"{tied_to}.weight"} if tied_to else {},
            }
    version = re.search(r"^Version: (.+)$", metadata, re.MULTILINE).group(1).strip()
    return {
        "source": f"vllm {version} wheel ({wheel.name}), read with tests/record_vllm_api.py",
        "version": version,
        "requires": {name: _requirement(metadata, name) for name in ("torch", "transformers")},
        "llm_init": sorted(set(_parameters(_method(llm_class, "__init__"))) | set(_fields(_class(arg_utils, "EngineArgs")))),
        "llm_methods": {name: _parameters(_method(llm_class, name))
                        for name in ("generate", "sleep", "wake_up", "reset_prefix_cache")},
        "sampling_params": _fields(_class(sampling, "SamplingParams")),
        "tokens_prompt": _fields(_class(inputs, "_PromptOptions")) + _fields(_class(inputs, "TokensPrompt")),
        "logprobs_modes": _literal_alias(model_config, "LogprobsMode"),
        "distributed_executor_backends": _literal_alias(parallel, "DistributedExecutorBackend"),
        "temperature_max": _temperature_maximum(sampling),
        "temperature_min_nonzero": _constant(sampling, "_MAX_TEMP"),  # (0, this) is raised to this
        "greedy_below": _constant(sampling, "_SAMPLING_EPS"),
        "dropped_weight_substrings": _dropped_substrings(utils),
        "weight_rules": weight_rules,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path, help="the vllm wheel (pip download vllm==0.33.0 --no-deps)")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    data = record(args.wheel)
    args.output.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.output} from vllm {data['version']}: {len(data['llm_init'])} engine keywords, "
          f"{len(data['sampling_params'])} sampling fields")
    return 0


if __name__ == "__main__":
    sys.exit(main())
