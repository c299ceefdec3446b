"""A small OpenAI-compatible server for tests and benchmarks: ``/v1/completions`` and
``/v1/chat/completions`` on uvicorn, answering with real ``usage``, and told by ``POST
/control`` to answer a share of requests with 429 + ``Retry-After``, with a 5xx or with
malformed JSON, or to stall, or to answer with the prompt it was sent (``echo_prompt``), or
(``echo_key``) to answer every request with the key it was sent
transformed, as a hostile server would to get it into an error line. ``GET /stats`` says what it
received (arrival times, models, the keys that came, ``""`` for a request without one, how many
answers of each kind, and with a ``delay`` the most requests it held at once).

The model is a fake at the outer edge: it answers "What is A plus B?" with the sum (wrong on
purpose for the models named ``wrong-*``), a grader's prompt (evalq's default, with its expert
answer and submission) with ``GRADE: C`` when the two agree and ``GRADE: I`` otherwise,
anything else with "ok"; tokens are words; it answers no log-likelihoods (an ``echo`` request
gets a plain answer, as from a server without them). With ``--model-dir`` it serves a real model
instead (:class:`evalq.shared.lm.hf.HFModel`, one request at a time), which is what
``bench/endpoint.py`` measures, and answers a prompt of token ids with ``echo`` and ``logprobs``
as vLLM does: each prompt token's log-probability (None for the first) and the most likely
token's at each position, then one greedy token's.

Run: ``python -m tests.openai_server --port P [--model-dir DIR] [--key KEY]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import random
import re
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

__all__ = ["make_app"]

_SUM = re.compile(r"What is (-?\d+) plus (-?\d+)")
_GRADED = re.compile(r"\[Expert answer\]: (.*)\n\[Submission\]: (.*)")


class _State:
    def __init__(self) -> None:
        self.control: dict[str, Any] = {
            "rate_limit_share": 0.0,
            "retry_after": 1,
            "error_share": 0.0,
            "malformed_share": 0.0,
            "stall": False,
            "delay": 0.0,
            "version": "1",
            "pad": 0,
            "echo_key": False,
            "echo_prompt": False,
        }
        self.arrivals: list[float] = []
        self.models: list[str] = []
        self.answers: dict[str, int] = {}
        self.keys: set[str] = set()
        self.inflight = 0
        self.most_inflight = 0
        self.rng = random.Random(0)
        self.lock = threading.Lock()


def _words(text: str) -> int:
    return max(1, len(text.split()))


def _fake_answer(model: str, text: str) -> str:
    graded = _GRADED.search(text)
    if graded is not None:  # a grader's prompt: right when the two answers agree
        return "GRADE: C" if graded.group(1) == graded.group(2) else "GRADE: I"
    found = _SUM.search(text)
    if found is None:
        return "ok"
    total = int(found.group(1)) + int(found.group(2))
    return str(total + 1 if model.startswith("wrong") else total)


def _add_control(app: FastAPI, state: _State) -> None:
    """The routes that tell the server how to behave and say what it saw."""

    @app.post("/control")
    async def control(request: Request) -> dict[str, Any]:
        state.control.update(await request.json())
        return state.control

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        """The served model, as vLLM names it: ``root`` is where its weights came from (here
        ``/models/<version>``, changed through ``/control``)."""
        root = f"/models/{state.control['version']}"
        return {"data": [{"id": "served", "object": "model", "root": root}]}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        with state.lock:
            return {
                "arrivals": list(state.arrivals),
                "models": list(state.models),
                "answers": dict(state.answers),
                "keys": sorted(state.keys),
                "most_inflight": state.most_inflight,
            }

    @app.post("/reset")
    async def reset() -> dict[str, str]:
        with state.lock:
            state.arrivals.clear()
            state.models.clear()
            state.answers.clear()
            state.keys.clear()
        return {"ok": "reset"}


def make_app(key: str | None = None, generate: Any = None, score: Any = None) -> FastAPI:
    """The server; ``generate(prompt_text, max_tokens) -> (text, prompt_tokens,
    completion_tokens)`` replaces the fake model, and ``score(token_ids) -> (text, logprobs)``
    answers ``echo`` requests."""
    app = FastAPI()
    state = _State()
    serial = asyncio.Lock()  # the real model answers one request at a time

    _add_control(app, state)

    async def answer(request: Request, chat: bool) -> Response:
        body = await request.json()
        with state.lock:
            state.arrivals.append(time.time())
            state.models.append(str(body.get("model")))
            given = request.headers.get("authorization", "")
            state.keys.add(given.removeprefix("Bearer "))
            draw = state.rng.random()
        if key is not None and request.headers.get("authorization") != f"Bearer {key}":
            return _count(state, "unauthorized", JSONResponse({"error": "bad key"}, 401))
        while state.control["stall"]:  # until told otherwise (or the server stops)
            await asyncio.sleep(0.05)
        fault = _fault(state, draw)
        if fault is not None:
            return fault
        if state.control["delay"]:
            with state.lock:
                state.inflight += 1
                state.most_inflight = max(state.most_inflight, state.inflight)
            await asyncio.sleep(float(state.control["delay"]))
            with state.lock:
                state.inflight -= 1
        model = str(body.get("model"))
        if chat:
            text = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        else:
            text = str(body.get("prompt", ""))
        max_tokens = int(body.get("max_tokens") or 16)
        if state.control["echo_key"]:
            return _count(state, "echoed", _echo(given.removeprefix("Bearer "), text, chat))
        tokens = body.get("prompt")
        if score is not None and body.get("echo") and isinstance(tokens, list):
            async with serial:
                return _count(state, "scored", await _scored(score, model, tokens))
        if generate is not None:
            async with serial:
                made, prompt_tokens, completion_tokens = await asyncio.to_thread(
                    generate, text, max_tokens
                )
        elif state.control["echo_prompt"]:  # what a caller's own server does with a prompt
            made = text
        else:
            made = _fake_answer(model, text)
            prompt_tokens, completion_tokens = _words(text), _words(made)
        if state.control["pad"]:  # an answer of that many more bytes, claimed one token
            made, completion_tokens = made + "x" * int(state.control["pad"]), 1
        reply = _reply(model, made, chat, prompt_tokens, completion_tokens)
        return _count(state, "ok", JSONResponse(reply))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await answer(request, chat=True)

    return app


async def _scored(score: Any, model: str, tokens: list[int]) -> Response:
    """An ``echo`` request's answer: the prompt's log-probabilities and one greedy token."""
    made, logprobs = await asyncio.to_thread(score, tokens)
    reply = _reply(model, made, False, len(tokens), 1)
    reply["choices"][0]["logprobs"] = logprobs
    return JSONResponse(reply)


def _fault(state: _State, draw: float) -> Response | None:
    """The fault ``draw`` (uniform in [0, 1)) falls on, as the control's shares say."""
    control = state.control
    if draw < control["rate_limit_share"]:
        headers = {"Retry-After": str(control["retry_after"])}
        return _count(state, "429", JSONResponse({"error": "slow down"}, 429, headers))
    draw -= control["rate_limit_share"]
    if draw < control["error_share"]:
        return _count(state, "500", JSONResponse({"error": "boom"}, 500))
    draw -= control["error_share"]
    if draw < control["malformed_share"]:
        return _count(state, "malformed", PlainTextResponse("{not json", 200))
    return None


ECHOES = 6
"""How many ways :func:`_echo` sends a key back: the sample ``What is A plus …`` gets way
``A % ECHOES``."""


def echoed(key: str) -> list[str]:
    """Every text :func:`_echo` hides ``key`` in: what no error line may hold."""
    escaped = "".join(f"\\u{ord(c):04x}" for c in key)
    half = len(key) // 2
    return [
        base64.b64encode(key.encode()).decode(), key[::-1], key[:half], key[half:],
        key.lower(), escaped, key,
    ]  # fmt: skip


def _echo(key: str, text: str, chat: bool) -> Response:
    """An answer that carries ``key`` back, transformed by the sample's way: in a 401's body
    (base64, reversed, split across two fields, lower-cased, JSON-escaped) or, the sixth way,
    reversed where a 200's token count should be."""
    found = _SUM.search(text)
    way = int(found.group(1)) % ECHOES if found is not None else 0
    b64, backwards, first, second, lower, escaped, _ = echoed(key)
    said = "Incorrect API key provided: "
    bodies = [
        {"error": {"message": said + b64}},
        {"error": {"message": said + backwards}},
        {"error": {"code": first, "param": second}},
        {"error": {"message": said.lower() + lower}},
    ]
    if way < len(bodies):
        return JSONResponse(bodies[way], 401)
    if way == len(bodies):
        return Response('{"error": "' + escaped + '"}', 401, media_type="application/json")
    reply = _reply("m", "ok", chat, 1, 1)
    reply["usage"]["prompt_tokens"] = backwards
    return JSONResponse(reply)


def _reply(
    model: str, made: str, chat: bool, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
    if chat:
        choice["message"] = {"role": "assistant", "content": made}
    else:
        choice["text"] = made
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    reply = {"id": "x", "object": "text_completion", "model": model, "choices": [choice]}
    return {**reply, "usage": usage}


def _count(state: _State, kind: str, response: Response) -> Response:
    with state.lock:
        state.answers[kind] = state.answers.get(kind, 0) + 1
    return response


def _hf_generate(model_dir: str) -> Any:
    from evalq.shared.lm.hf import HFModel
    from evalq.shared.lm.request import GenerationRequest
    from evalq.shared.lm.spec import ModelSpec

    model = HFModel.load(ModelSpec.parse(f"hf/{model_dir}"), "cpu")

    def generate(text: str, max_tokens: int) -> tuple[str, int, int]:
        (made,) = model.generate([GenerationRequest(text, max_tokens)])
        return made.text, made.prompt_tokens, made.completion_tokens

    return generate


def _hf_score(model_dir: str) -> Any:
    """``score(token_ids)``: the echoed prompt's log-probabilities by SmolLM2 (float32, one
    sequence a forward pass), as vLLM's ``/v1/completions`` reports them with ``logprobs: 1``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def named(token: int) -> str:
        return str(tokenizer.decode([token]))

    lm: Any = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    lm.eval()

    def score(tokens: list[int]) -> tuple[str, dict[str, Any]]:
        with torch.no_grad():
            logits = lm(torch.tensor([tokens])).logits[0].float()
        table = torch.log_softmax(logits, dim=-1)
        best = [int(i) for i in table.argmax(dim=-1)]
        every = [*tokens, best[-1]]  # the prompt, then one greedy token
        values: list[float | None] = [None]
        tops: list[dict[str, float] | None] = [None]
        for i in range(1, len(every)):
            values.append(float(table[i - 1, every[i]]))
            tops.append({named(best[i - 1]): float(table[i - 1, best[i - 1]])})
        shown = [named(t) for t in every]
        return named(best[-1]), {"tokens": shown, "token_logprobs": values, "top_logprobs": tops}

    return score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", default=None)
    parser.add_argument("--model-dir", default=None)
    args = parser.parse_args()
    generate = _hf_generate(args.model_dir) if args.model_dir else None
    score = _hf_score(args.model_dir) if args.model_dir else None
    app = make_app(args.key, generate, score)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
