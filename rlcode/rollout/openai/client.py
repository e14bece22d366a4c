"""Sampling from an OpenAI-compatible server (``vllm serve``, llama.cpp's server, OpenAI) over HTTP.

Standard library only (urllib and threads), so ``rlcode-eval --generate`` stays free of torch; the
rollout backend (``rlcode.rollout.openai.backend``) builds training batches on top of it.

- One request per sample (``n`` is not sent: llama.cpp's server ignores it), at most
  ``max_concurrency`` in flight; each has its own seed, so a group's samples differ reproducibly.
- Connection failures, timeouts, HTTP 408/409/429/5xx are retried ``max_retries`` times with
  exponential backoff; other HTTP errors and answers that are not OpenAI-shaped JSON fail at once.
  Every failure is one line (``ServedModelError``) naming the server, the cause and the fix.
- The model name is checked against ``/v1/models`` before the first sample: llama.cpp's server
  answers whatever name it is sent, so a typo would otherwise go unnoticed.
- The API key is read from the environment only (``RLCODE_OPENAI_API_KEY``, then
  ``OPENAI_API_KEY``): settings have no key field, so a key can never land in a saved config.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from rlcode.setting import COUNT, COUNT_OR_ZERO, IMPORTANCE_CAP, NON_NEGATIVE, POSITIVE, check_arguments, field_of

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"  # `vllm serve`'s default port
BASE_URL_VARIABLES = ("RLCODE_OPENAI_BASE_URL", "OPENAI_BASE_URL")
MODEL_VARIABLE = "RLCODE_OPENAI_MODEL"
API_KEY_VARIABLES = ("RLCODE_OPENAI_API_KEY", "OPENAI_API_KEY")
RETRIED_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
MAX_BACKOFF_SECONDS = 30.0
TOKEN_ID_PREFIX = "token_id:"  # vLLM's spelling of a token under return_tokens_as_token_ids

Api = Literal["chat", "completions"]
Messages = list[dict[str, str]]
PromptPayload = Union[str, list[int], Messages]


class ServedModelError(RuntimeError):
    """The server is unreachable, refused a request or answered something unusable, or the served model
    was asked for what it cannot give (training without token ids). One line: cause and fix."""


@dataclass
class OpenAISettings:
    """Where the served model is and how to talk to it (``rollout_backend: openai``, served opponents).

    Args:
        base_url: the server's ``/v1`` root (None: ``RLCODE_OPENAI_BASE_URL``, ``OPENAI_BASE_URL``,
            else ``http://127.0.0.1:8000/v1``).
        model: the served model's name (None: ``RLCODE_OPENAI_MODEL``, else the server's only model).
        api: ``"chat"`` sends chat messages to ``/v1/chat/completions`` and the server applies its
            model's chat template (what OpenAI's models need; dry runs, opponents, evaluation);
            ``"completions"`` sends the prompt the trainer rendered to ``/v1/completions`` (what
            training needs: the trainer then knows every prompt token).
        max_concurrency: requests in flight at once.
        timeout: seconds to wait for the connection and for each read of an answer.
        max_retries: further attempts after a connection failure, timeout, 408/409/429 or 5xx.
        backoff: seconds before the first retry, doubled at each further one (at most 30 s).
        logprobs: ask for the log-prob of each sampled token (set false for servers that refuse it).
        token_ids: ask for the sampled token ids (vLLM's ``return_tokens_as_token_ids``, with the
            stop string kept in the output as the trainer's other backends do). Needed to train;
            servers other than vLLM do not return them (OpenAI rejects the field).
        importance_sampling_cap: when training, tokens are weighted by min(exp(policy - server
            log-prob), cap): the served weights are not the trainer's (TRL's truncated correction).
        extra_body: further fields sent with every request (e.g. ``{"min_p": 0.05}`` for vLLM).
    """

    base_url: str | None = None
    model: str | None = None
    api: Api = "chat"
    max_concurrency: Annotated[int, field_of(COUNT)] = 8
    timeout: Annotated[float, field_of(POSITIVE)] = 120.0
    max_retries: Annotated[int, field_of(COUNT_OR_ZERO)] = 3
    backoff: Annotated[float, field_of(NON_NEGATIVE)] = 0.5
    logprobs: bool = True
    token_ids: bool = False
    importance_sampling_cap: Annotated[float, field_of(IMPORTANCE_CAP)] = 3.0
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.api not in ("chat", "completions"):
            raise ValueError(f"openai api={self.api!r} is unknown: use 'chat' or 'completions'")
        check_arguments(OpenAISettings, vars(self), prefix="openai.")
        if self.token_ids and not self.logprobs:
            raise ValueError("openai token_ids needs logprobs: vLLM returns the ids inside the log-probs")
        if any(key in self.extra_body for key in ("api_key", "authorization", "Authorization")):
            raise ValueError("openai extra_body holds a key: set RLCODE_OPENAI_API_KEY in the environment instead")

    def resolved_base_url(self) -> str:
        configured = self.base_url or next((os.environ[v] for v in BASE_URL_VARIABLES if os.environ.get(v)), None)
        return (configured or DEFAULT_BASE_URL).rstrip("/")

    def resolved_model(self) -> str | None:
        return self.model or os.environ.get(MODEL_VARIABLE) or None


def as_settings(value: OpenAISettings | dict | None) -> OpenAISettings:
    """Settings from themselves, their dict (hyperparameters restored from a checkpoint) or None (defaults)."""
    if isinstance(value, dict):
        return OpenAISettings(**value)
    return value if value is not None else OpenAISettings()


@dataclass(frozen=True)
class SampleRequest:
    """One sample: the prompt (text or token ids for completions, messages for chat) and sampling."""

    prompt: PromptPayload
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass
class ServedCompletion:
    """What the server sampled for one request."""

    text: str
    finish_reason: str
    token_ids: list[int] | None = None
    """The sampled ids (vLLM with ``token_ids``), else None."""
    logprobs: list[float] | None = None
    """One log-prob per sampled token, when asked for and given."""
    completion_tokens: int | None = None
    prompt_tokens: int | None = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def num_tokens(self) -> int:
        """Sampled tokens: the ids, else the log-probs, else the server's usage count, else 0."""
        for counted in (self.token_ids, self.logprobs):
            if counted is not None:
                return len(counted)
        return self.completion_tokens or 0


def api_key() -> str | None:
    """The API key, from the environment only."""
    return next((os.environ[v] for v in API_KEY_VARIABLES if os.environ.get(v)), None)


class OpenAIClient:
    def __init__(self, settings: OpenAISettings | None = None) -> None:
        """Sample from the server ``settings`` name; the model is resolved and checked at first use."""
        self.settings = settings if settings is not None else OpenAISettings()
        self.base_url = self.settings.resolved_base_url()
        self._model: str | None = None
        self._model_lock = threading.Lock()

    # ---- the model --------------------------------------------------------------------------------
    def served_models(self) -> list[str]:
        """The ids ``/v1/models`` lists."""
        answer = self._call("GET", "/models")
        try:
            return [str(entry["id"]) for entry in answer["data"]]
        except (KeyError, TypeError):
            raise ServedModelError(f"{self.base_url}/models answered JSON without data[].id: is base_url "
                                   "the /v1 root of an OpenAI-compatible server?") from None

    def model(self) -> str:
        """The model name to send, checked once against the served models."""
        with self._model_lock:
            if self._model is None:
                self._model = self._resolve_model()
            return self._model

    def _resolve_model(self) -> str:
        wanted, served = self.settings.resolved_model(), self.served_models()
        if wanted is None:
            if len(served) == 1:
                return served[0]
            raise ServedModelError(f"{self.base_url} serves {len(served)} models ({', '.join(served) or 'none'}): "
                                   f"set openai.model (or {MODEL_VARIABLE}) to one of them")
        if wanted not in served:
            raise ServedModelError(f"model {wanted!r} is not served at {self.base_url}; it serves: "
                                   f"{', '.join(served) or 'nothing'}: set openai.model (or {MODEL_VARIABLE}) "
                                   "to one of them")
        return wanted

    # ---- sampling ---------------------------------------------------------------------------------
    def complete(self, requests: list[SampleRequest]) -> list[ServedCompletion]:
        """One completion per request, in order; at most ``max_concurrency`` requests in flight."""
        if not requests:
            return []
        model = self.model()
        workers = min(self.settings.max_concurrency, len(requests))
        if workers == 1:
            return [self._complete_one(model, request) for request in requests]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="openai") as pool:
            futures = [pool.submit(self._complete_one, model, request) for request in requests]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:  # the first failure decides: do not send what has not started
                    future.cancel()
                raise

    def _complete_one(self, model: str, request: SampleRequest) -> ServedCompletion:
        chat = self.settings.api == "chat"
        body = request_body(model, request, self.settings)
        answer = self._call("POST", "/chat/completions" if chat else "/completions", body)
        return parse_completion(answer, chat=chat, want_token_ids=self.settings.token_ids,
                                where=f"{self.base_url}/{'chat/completions' if chat else 'completions'}")

    # ---- HTTP with retries ------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        url = self.base_url + path
        data = None if body is None else json.dumps(body).encode()
        attempts = self.settings.max_retries + 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                raw = self._send(urllib.request.Request(url, data=data, method=method, headers=_headers()))
            except urllib.error.HTTPError as error:
                if error.code in RETRIED_STATUSES and not last:
                    self._sleep(attempt)
                    continue
                raise ServedModelError(_http_error_line(url, error, attempt + 1)) from None
            except (TimeoutError, socket.timeout):
                if last:
                    raise ServedModelError(f"{url} did not answer within {self.settings.timeout:g}s "
                                           f"({attempts} attempts): raise openai.timeout, or check the "
                                           "server is not stuck") from None
                self._sleep(attempt)
                continue
            except (urllib.error.URLError, ConnectionError, OSError) as error:
                if last:
                    reason = getattr(error, "reason", error)
                    raise ServedModelError(f"cannot reach the OpenAI-compatible server at {self.base_url} "
                                           f"({_one_line(reason)}; {attempts} attempts): start it (e.g. "
                                           "`vllm serve MODEL` or `python -m llama_cpp.server --model FILE`) "
                                           "or point openai.base_url, --base-url or RLCODE_OPENAI_BASE_URL at it") from None
                self._sleep(attempt)
                continue
            try:
                answer = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ServedModelError(f"{url} answered something that is not JSON ({_excerpt(raw)}): is "
                                       "base_url the /v1 root of an OpenAI-compatible server?") from None
            if not isinstance(answer, dict):
                raise ServedModelError(f"{url} answered a JSON {type(answer).__name__}, not an object: "
                                       "is base_url the /v1 root of an OpenAI-compatible server?")
            return answer
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _send(self, request: urllib.request.Request) -> bytes:
        with urllib.request.urlopen(request, timeout=self.settings.timeout) as response:
            return response.read()

    def _sleep(self, attempt: int) -> None:
        time.sleep(min(self.settings.backoff * 2 ** attempt, MAX_BACKOFF_SECONDS))


def request_body(model: str, request: SampleRequest, settings: OpenAISettings) -> dict[str, Any]:
    """The JSON body of one request; fields beyond OpenAI's are sent only when asked for."""
    chat = settings.api == "chat"
    body: dict[str, Any] = {"model": model, "max_tokens": request.max_tokens, "temperature": request.temperature}
    if chat:
        body["messages"] = request.prompt
    else:
        body["prompt"] = request.prompt
    if request.top_p < 1:
        body["top_p"] = request.top_p
    if request.top_k > 0:
        body["top_k"] = request.top_k  # vLLM and llama.cpp take it; OpenAI does not
    if request.stop:
        body["stop"] = list(request.stop)
    if request.seed is not None:
        body["seed"] = request.seed
    if settings.logprobs:
        if chat:  # llama.cpp's server answers logprobs: null unless top_logprobs is at least 1
            body.update(logprobs=True, top_logprobs=1)
        else:
            body["logprobs"] = 1  # how many alternatives besides the sampled token
    if settings.token_ids:
        body["return_tokens_as_token_ids"] = True
        body["include_stop_str_in_output"] = True  # the trained tokens must be all the sampled ones
    body.update(settings.extra_body)
    return body


def parse_completion(answer: dict, *, chat: bool, want_token_ids: bool, where: str) -> ServedCompletion:
    """One OpenAI-shaped answer (chat or completions) -> text, finish reason, ids and log-probs."""
    try:
        choice = answer["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        finish_reason = str(choice.get("finish_reason") or "stop")
    except (KeyError, IndexError, TypeError):
        raise ServedModelError(f"{where} answered JSON without choices[0].{'message.content' if chat else 'text'}: "
                               "not an OpenAI-compatible completion") from None
    tokens, logprobs = _token_logprobs(choice.get("logprobs"), chat)
    token_ids = None
    if want_token_ids:
        token_ids = _vllm_token_ids(tokens)
        if token_ids is None:
            raise ServedModelError(f"{where} did not return token ids (return_tokens_as_token_ids is vLLM's): set "
                                   "openai.token_ids false; without ids the backend serves dry runs, opponents "
                                   "and evaluation, not training")
    usage = answer.get("usage") or {}
    return ServedCompletion(text=text or "", finish_reason=finish_reason, token_ids=token_ids, logprobs=logprobs,
                            completion_tokens=usage.get("completion_tokens"), prompt_tokens=usage.get("prompt_tokens"))


def _token_logprobs(block, chat: bool) -> tuple[list[str] | None, list[float] | None]:
    """(tokens, log-probs) from a choice's ``logprobs`` in either endpoint's shape, or (None, None)."""
    if not isinstance(block, dict):
        return None, None
    if chat:
        content = block.get("content")
        if not isinstance(content, list):
            return None, None
        return [str(e.get("token", "")) for e in content], [float(e.get("logprob", 0.0)) for e in content]
    tokens, values = block.get("tokens"), block.get("token_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list):
        return None, None
    return [str(t) for t in tokens], [float(v) if v is not None else 0.0 for v in values]


def _vllm_token_ids(tokens: list[str] | None) -> list[int] | None:
    """vLLM's ``token_id:123`` tokens -> ids; None when any token is spelled otherwise."""
    if tokens is None:
        return None
    ids = []
    for token in tokens:
        if not token.startswith(TOKEN_ID_PREFIX) or not token[len(TOKEN_ID_PREFIX):].isdigit():
            return None
        ids.append(int(token[len(TOKEN_ID_PREFIX):]))
    return ids


def _headers() -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    key = api_key()
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def _http_error_line(url: str, error: urllib.error.HTTPError, attempts: int) -> str:
    try:
        detail = error.read()
    except OSError:
        detail = b""
    fix = {401: "set RLCODE_OPENAI_API_KEY (or OPENAI_API_KEY) in the environment",
           403: "check the API key's permissions", 404: "check openai.base_url ends in /v1 and the api setting"
           }.get(error.code, "check the request settings against the server" if error.code < 500
                 else "check the server's log")
    return f"{url} answered HTTP {error.code} ({_excerpt(detail)}) after {attempts} attempt(s): {fix}"


def _excerpt(raw: bytes | str, limit: int = 160) -> str:
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return repr(_one_line(text)[:limit]) if text else "empty body"


def _one_line(value) -> str:
    return " ".join(str(value).split())
