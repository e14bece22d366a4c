"""The OpenAI-compatible backend's failure paths and decisions, without a real server.

A local stub HTTP server (127.0.0.1 only) plays the failures a real server cannot be made to show on
demand: no server, timeouts, HTTP 500, malformed JSON, a wrong model name, a missing key. What a
real server answers is tested against llama.cpp's server in tests/test_openai_served.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlcode.rollout.openai.client import (OpenAIClient, OpenAISettings, SampleRequest, ServedModelError,
                                          parse_completion, request_body)

MODELS = {"object": "list", "data": [{"id": "served-model", "object": "model"}]}
CHAT_ANSWER = {"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 5, "completion_tokens": 1}}


class Stub:
    """A stub server whose answers are scripted per path: a list of (status, body, delay) popped in order,
    the last one repeating. Records every request (path, headers, body)."""

    def __init__(self, script: dict[str, list[tuple[int, bytes, float]]]):
        self.script = script
        self.requests: list[tuple[str, dict, dict | None]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                stub.requests.append((self.path, dict(self.headers), json.loads(raw) if raw else None))
                answers = stub.script.get(self.path, [(404, b'{"error": "no such path"}', 0.0)])
                status, body, delay = answers.pop(0) if len(answers) > 1 else answers[0]
                time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub_server():
    servers = []

    def start(script):
        servers.append(Stub(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def ok(body) -> tuple[int, bytes, float]:
    return 200, json.dumps(body).encode(), 0.0


def client_for(base_url: str, **settings) -> OpenAIClient:
    return OpenAIClient(OpenAISettings(base_url=base_url, backoff=0.0, **settings))


def one_request() -> list[SampleRequest]:
    return [SampleRequest(prompt=[{"role": "user", "content": "hi"}], max_tokens=4)]


def test_unreachable_server_is_one_line_after_bounded_retries():
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = client_for(f"http://127.0.0.1:{port}/v1", max_retries=2)
    with pytest.raises(ServedModelError) as error:
        client.complete(one_request())
    message = str(error.value)
    assert "\n" not in message
    assert f"cannot reach the OpenAI-compatible server at http://127.0.0.1:{port}/v1" in message
    assert "3 attempts" in message and "RLCODE_OPENAI_BASE_URL" in message


def test_wrong_model_name_lists_the_served_models(stub_server):
    stub = stub_server({"/v1/models": [ok({"data": [{"id": "a"}, {"id": "b"}]})]})
    with pytest.raises(ServedModelError, match=r"model 'c' is not served at .*; it serves: a, b: set openai.model"):
        client_for(stub.base_url, model="c").complete(one_request())
    assert [path for path, _, _ in stub.requests] == ["/v1/models"]  # nothing sampled with the wrong name


def test_no_model_name_takes_the_only_served_one_and_refuses_a_choice_of_several(stub_server):
    single = stub_server({"/v1/models": [ok(MODELS)]})
    assert client_for(single.base_url).model() == "served-model"
    several = stub_server({"/v1/models": [ok({"data": [{"id": "a"}, {"id": "b"}]})]})
    with pytest.raises(ServedModelError, match="serves 2 models"):
        client_for(several.base_url).model()


def test_http_500_is_retried_then_reported(stub_server):
    stub = stub_server({"/v1/models": [ok(MODELS)], "/v1/chat/completions": [(500, b'{"error": "boom"}', 0.0)]})
    with pytest.raises(ServedModelError, match=r"answered HTTP 500 .*boom.* after 3 attempt\(s\)"):
        client_for(stub.base_url, max_retries=2).complete(one_request())
    assert sum(path == "/v1/chat/completions" for path, _, _ in stub.requests) == 3


def test_a_transient_503_is_retried_and_the_answer_used(stub_server):
    stub = stub_server({"/v1/models": [ok(MODELS)],
                        "/v1/chat/completions": [(503, b"busy", 0.0), ok(CHAT_ANSWER)]})
    [completion] = client_for(stub.base_url, max_retries=1).complete(one_request())
    assert completion.text == "ok" and completion.completion_tokens == 1


def test_a_client_error_is_not_retried(stub_server):
    stub = stub_server({"/v1/models": [ok(MODELS)], "/v1/chat/completions": [(400, b'{"error": "bad"}', 0.0)]})
    with pytest.raises(ServedModelError, match="HTTP 400"):
        client_for(stub.base_url, max_retries=3).complete(one_request())
    assert sum(path == "/v1/chat/completions" for path, _, _ in stub.requests) == 1


def test_timeout_names_the_limit(stub_server):
    stub = stub_server({"/v1/models": [ok(MODELS)], "/v1/chat/completions": [(200, b"{}", 2.0)]})
    started = time.monotonic()
    with pytest.raises(ServedModelError, match=r"did not answer within 0.3s \(2 attempts\): raise openai.timeout"):
        client_for(stub.base_url, timeout=0.3, max_retries=1).complete(one_request())
    assert time.monotonic() - started < 2.0  # bounded: two 0.3 s waits, no backoff


def test_malformed_json_is_one_line(stub_server):
    stub = stub_server({"/v1/models": [ok(MODELS)], "/v1/chat/completions": [(200, b"<html>nope\n</html>", 0.0)]})
    with pytest.raises(ServedModelError, match=r"not JSON \('<html>nope </html>'\): is base_url the /v1 root") as error:
        client_for(stub.base_url).complete(one_request())
    assert "\n" not in str(error.value)


def test_json_that_is_not_a_completion_is_refused():
    with pytest.raises(ServedModelError, match=r"without choices\[0\].message.content"):
        parse_completion({"result": "hi"}, chat=True, want_token_ids=False, where="x")


def test_missing_key_on_401_says_which_variables(stub_server, monkeypatch):
    for name in ("RLCODE_OPENAI_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    stub = stub_server({"/v1/models": [(401, b'{"error": "no key"}', 0.0)]})
    with pytest.raises(ServedModelError, match="HTTP 401 .* set RLCODE_OPENAI_API_KEY"):
        client_for(stub.base_url).model()
    assert "Authorization" not in stub.requests[0][1]


def test_the_key_comes_from_the_environment_only(stub_server, monkeypatch):
    monkeypatch.setenv("RLCODE_OPENAI_API_KEY", "sk-test-env")
    stub = stub_server({"/v1/models": [(401, b"{}", 0.0)]})
    with pytest.raises(ServedModelError):
        client_for(stub.base_url).model()
    assert stub.requests[0][1]["Authorization"] == "Bearer sk-test-env"
    with pytest.raises(ValueError, match="environment"):
        OpenAISettings(extra_body={"api_key": "sk-in-a-yaml"})
    assert "api_key" not in OpenAISettings.__dataclass_fields__


def test_base_url_and_model_fall_back_to_the_environment(monkeypatch):
    monkeypatch.setenv("RLCODE_OPENAI_BASE_URL", "http://127.0.0.1:1234/v1/")
    monkeypatch.setenv("RLCODE_OPENAI_MODEL", "m")
    settings = OpenAISettings()
    assert (settings.resolved_base_url(), settings.resolved_model()) == ("http://127.0.0.1:1234/v1", "m")
    assert OpenAISettings(base_url="http://127.0.0.1:9/v1", model="x").resolved_model() == "x"


def test_request_body_sends_vllm_fields_only_when_asked():
    request = SampleRequest(prompt="p", max_tokens=8, temperature=0.5, top_k=0, stop=("\n```\n",), seed=3)
    plain = request_body("m", request, OpenAISettings(api="completions"))
    assert plain == {"model": "m", "prompt": "p", "max_tokens": 8, "temperature": 0.5, "stop": ["\n```\n"],
                     "seed": 3, "logprobs": 1}
    vllm = request_body("m", request, OpenAISettings(api="completions", token_ids=True))
    assert vllm["return_tokens_as_token_ids"] is True and vllm["include_stop_str_in_output"] is True
    chat = request_body("m", SampleRequest(prompt=[{"role": "user", "content": "q"}], max_tokens=2),
                        OpenAISettings(logprobs=False))
    assert chat == {"model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": 2, "temperature": 1.0}


def test_vllm_token_ids_are_parsed_and_text_tokens_refused_for_training():
    answer = {"choices": [{"text": "a b", "finish_reason": "length",
                           "logprobs": {"tokens": ["token_id:7", "token_id:12"], "token_logprobs": [-0.5, -1.0]}}]}
    completion = parse_completion(answer, chat=False, want_token_ids=True, where="x")
    assert (completion.token_ids, completion.logprobs, completion.truncated) == ([7, 12], [-0.5, -1.0], True)
    text_tokens = {"choices": [{"message": {"content": "a b"}, "finish_reason": "stop",
                                "logprobs": {"content": [{"token": "a", "logprob": -0.1}, {"token": " b", "logprob": -2.0}]}}]}
    with pytest.raises(ServedModelError, match="did not return token ids"):
        parse_completion(text_tokens, chat=True, want_token_ids=True, where="x")
    completion = parse_completion(text_tokens, chat=True, want_token_ids=False, where="x")
    assert (completion.token_ids, completion.logprobs, completion.num_tokens) == (None, [-0.1, -2.0], 2)


def test_training_is_refused_unless_the_prompt_and_sampled_tokens_are_known():
    from rlcode.rollout.openai.backend import OpenAIBackend

    assert "chat template" in OpenAIBackend(OpenAISettings(api="chat")).training_unsupported_reason()
    assert "token ids" in OpenAIBackend(OpenAISettings(api="completions")).training_unsupported_reason()
    no_tokenizer = OpenAIBackend(OpenAISettings(api="completions", token_ids=True))
    assert "tokenizer" in no_tokenizer.training_unsupported_reason()
    assert no_tokenizer.importance_sampling_cap is None


def test_fit_with_a_backend_that_cannot_train_is_one_error():
    from rlcode.modes import GRPO
    from grpo_harness import learner
    from rlcode.rollout.openai.backend import OpenAIBackend

    module = learner(GRPO, model_name="tiny-random", rollout_backend="openai", num_generations=2)
    module.backend = OpenAIBackend(OpenAISettings(base_url="http://127.0.0.1:9/v1"))
    with pytest.raises(ServedModelError, match="rollout_backend openai cannot train here: api 'chat' .* --model.dry_run true"):
        module.on_fit_start()


def test_a_served_dry_run_with_chat_loads_neither_weights_nor_tokenizer(monkeypatch):
    import rlcode.models as models
    from rlcode.modes import GRPO
    from grpo_harness import learner
    from rlcode.rollout.rendering import ChatPrompt

    def refuse(*args, **kwargs):
        raise AssertionError("a served dry run loaded something local")

    monkeypatch.setattr(models, "load_model", refuse)
    monkeypatch.setattr(models, "load_tokenizer", refuse)
    module = learner(GRPO, model_name="smollm2-135m-instruct", rollout_backend="openai", dry_run=True,
                  openai={"base_url": "http://127.0.0.1:9/v1"})
    module.configure_model()
    assert module.policy is None and module.tokenizer is None
    prompt = module.render([{"role": "user", "content": "write f"}])
    assert isinstance(prompt, ChatPrompt) and prompt.messages == [{"role": "user", "content": "write f"}]
    assert len(module.configure_optimizers().param_groups[0]["params"]) == 1  # a placeholder to count steps


def test_served_opponent_needs_the_chat_api():
    from rlcode.envs.opponents import ServedOpponent
    from rlcode.rollout import SamplingParams

    with pytest.raises(ValueError, match="api to 'chat'"):
        ServedOpponent({"api": "completions", "base_url": "http://127.0.0.1:9/v1"}, SamplingParams())


def test_eval_generate_refuses_to_overwrite_and_reports_an_unreachable_server(tmp_path, capsys):
    from rlcode.eval.cli import main

    existing = tmp_path / "samples.jsonl"
    existing.write_text("{}\n")
    assert main(["--generate", str(existing), "--base-url", "http://127.0.0.1:9/v1"]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["--generate", str(tmp_path / "new.jsonl"), "--split", "validation", "--limit", "1",
                 "--base-url", "http://127.0.0.1:9/v1"]) == 1
    assert "cannot reach the OpenAI-compatible server" in capsys.readouterr().err


def test_rows_are_prompt_major_with_a_seed_per_sample_and_one_request_per_greedy_prompt(monkeypatch):
    """Batch assembly around the client (the HTTP side is the served tests'): requests and rows line up."""
    from rlcode.rollout import SamplingParams
    from rlcode.rollout.openai.backend import OpenAIBackend
    from rlcode.rollout.openai.client import ServedCompletion
    from rlcode.rollout.rendering import ChatPrompt

    backend = OpenAIBackend(OpenAISettings(base_url="http://127.0.0.1:9/v1"))
    sent: list[list[SampleRequest]] = []

    def answer(requests):
        sent.append(requests)
        return [ServedCompletion(text=f"r{i}", finish_reason="length" if i == 0 else "stop",
                                 logprobs=[-0.5] * (i + 1), prompt_tokens=3) for i in range(len(requests))]

    monkeypatch.setattr(backend.client, "complete", answer)
    batch = backend.generate([ChatPrompt("a"), "b"], 2, SamplingParams(temperature=1.0, max_new_tokens=4, seed=10))
    assert [r.seed for r in sent[0]] == [10, 11, 12, 13]
    assert [r.prompt for r in sent[0]] == [[{"role": "user", "content": "a"}]] * 2 + [[{"role": "user", "content": "b"}]] * 2
    assert batch.completion_texts == ["r0", "r1", "r2", "r3"]
    assert batch.completion_mask.sum(dim=1).tolist() == [1, 2, 3, 4]  # one pad token per reported log-prob
    assert batch.truncated.tolist() == [True, False, False, False]
    assert batch.prompt_mask.sum(dim=1).tolist() == [3, 3, 3, 3]
    assert batch.sampling_logps[batch.completion_mask.bool()].tolist() == [-0.5] * 10

    greedy = backend.generate(["a", "b"], 3, SamplingParams(temperature=0.0, max_new_tokens=4))
    assert len(sent[1]) == 2 and greedy.completion_texts == ["r0"] * 3 + ["r1"] * 3
    completions = OpenAIBackend(OpenAISettings(base_url="http://127.0.0.1:9/v1", api="completions"))
    with pytest.raises(ValueError, match="got chat messages"):
        completions.generate([ChatPrompt("a")], 1, SamplingParams())
