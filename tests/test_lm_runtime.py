"""The LM runtime on a tiny random GPT-2: batching never changes a row's output, seeded sampling
is per request, stop strings and token counts are exact, log-likelihoods follow lm-eval's
rules; and model specs parse strictly."""

from __future__ import annotations

import os
import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch

from evalq.shared.errors import InputError
from evalq.shared.lm.hf import HFModel
from evalq.shared.lm.request import ChoiceRequest, GenerationRequest
from evalq.shared.lm.spec import ModelSpec, identity
from tests.lm_fixtures import BOS, tiny_model

PROMPTS = [
    "The quick brown",
    "Paris is the capital of France; Berlin is",
    "one",
    "def add(a, b):\n",
    "Question: what is two plus two? Answer:",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def lm(model_dir: Path) -> Iterator[HFModel]:
    """Batches of 3, so five prompts make two batches of mixed lengths. One thread: the
    model is too small to gain from more, and the test machine's cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield HFModel.load(ModelSpec.parse(f"hf/{model_dir}", {"batch_size": "3"}), "cpu")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def bos_lm(tmp_path_factory: pytest.TempPathFactory, lm: HFModel) -> HFModel:
    """A tokenizer that starts every encoding with ``<s>``, as Llama's does."""
    folder = tiny_model(tmp_path_factory.mktemp("bos"), add_bos=True)
    return HFModel.load(ModelSpec.parse(f"hf/{folder}", {"batch_size": "3"}), "cpu")


def alone(lm: HFModel, request: GenerationRequest) -> str:
    return lm.generate([request])[0].text


def direct_logprob(lm: HFModel, context: list[int], cont: list[int]) -> tuple[float, bool]:
    """Unbatched reference: sum of log_softmax at the continuation's positions."""
    ids = torch.tensor([context + cont])
    with torch.no_grad():
        logprobs = torch.log_softmax(lm.model(ids).logits[0], dim=-1)
    rows = logprobs[len(context) - 1 : len(context) + len(cont) - 1]
    picked = rows[torch.arange(len(cont)), torch.tensor(cont)]
    return float(picked.sum()), bool((rows.argmax(-1) == torch.tensor(cont)).all())


# --- generation ---------------------------------------------------------------------------


@pytest.mark.integration
def test_greedy_output_in_a_mixed_length_batch_equals_generating_it_alone(lm: HFModel) -> None:
    requests = [GenerationRequest(p, max_new_tokens=10) for p in PROMPTS]
    batched = lm.generate(requests)
    assert [g.text for g in batched] == [alone(lm, r) for r in requests]
    assert len({g.text for g in batched}) == len(PROMPTS)  # order kept, not one row repeated
    assert lm.generate(requests[::-1]) == batched[::-1]


@pytest.mark.integration
def test_each_row_keeps_its_own_max_new_tokens(lm: HFModel) -> None:
    requests = [
        GenerationRequest(p, max_new_tokens=n)
        for p, n in zip(PROMPTS, [3, 9, 1, 6, 12], strict=True)
    ]
    out = lm.generate(requests)
    assert [g.completion_tokens for g in out] == [3, 9, 1, 6, 12]
    for request, g in zip(requests, out, strict=True):
        longer = alone(lm, GenerationRequest(request.prompt, max_new_tokens=12))
        assert longer.startswith(g.text)
        assert g.text == alone(lm, request)


@pytest.mark.integration
def test_seeded_sampling_is_per_request_whatever_shares_the_batch(lm: HFModel) -> None:
    sampled = [
        GenerationRequest(p, max_new_tokens=10, temperature=1.0, top_p=0.9, seed=7) for p in PROMPTS
    ]
    texts = [g.text for g in lm.generate(sampled)]
    assert texts == [alone(lm, r) for r in sampled]
    # other companions, another order, greedy rows in the same batch
    greedy = [GenerationRequest(p[::-1], max_new_tokens=4) for p in PROMPTS]
    mixed = [*greedy[:2], sampled[3], *greedy[2:], sampled[0], sampled[4]]
    again = [g.text for g in lm.generate(mixed)]
    assert [again[2], again[-2], again[-1]] == [texts[3], texts[0], texts[4]]
    assert again[:2] + again[3:5] == [alone(lm, r) for r in greedy[:4]]
    # a seed matters, and sampling is not greedy decoding
    reseeded = [GenerationRequest(p, 10, temperature=1.0, top_p=0.9, seed=8) for p in PROMPTS]
    assert [g.text for g in lm.generate(reseeded)] != texts
    assert texts != [alone(lm, GenerationRequest(p, 10)) for p in PROMPTS]


def test_top_p_near_zero_is_greedy(lm: HFModel) -> None:
    for prompt in PROMPTS[:3]:
        nucleus = GenerationRequest(prompt, 8, temperature=5.0, top_p=1e-6, seed=3)
        assert alone(lm, nucleus) == alone(lm, GenerationRequest(prompt, 8))


def _stop_in(text: str) -> str:
    """An ASCII word of 3+ letters that starts after the text's first two characters."""
    match = re.search(r"[A-Za-z]{3,}", text[2:])
    assert match, f"no word in {text!r} to stop at"
    return match.group(0)[:3]


@pytest.mark.integration
def test_stop_strings_cut_at_the_first_one_and_end_the_row(lm: HFModel) -> None:
    for prompt in PROMPTS[:2]:
        free = lm.generate([GenerationRequest(prompt, max_new_tokens=16)])[0]
        stop = _stop_in(free.text)
        stopped = lm.generate([GenerationRequest(prompt, 16, stop=("\x00never", stop))])[0]
        assert stop not in stopped.text
        assert stopped.text == free.text[: free.text.index(stop)]
        # it ended at the token completing the stop string: one token fewer does not show it
        n = stopped.completion_tokens
        assert 1 < n < free.completion_tokens
        assert stop in alone(lm, GenerationRequest(prompt, max_new_tokens=n))
        assert stop not in alone(lm, GenerationRequest(prompt, max_new_tokens=n - 1))
        # mixed with rows without stops, the row is cut the same
        batch = lm.generate(
            [GenerationRequest(p, 16) for p in PROMPTS[2:]]
            + [GenerationRequest(prompt, 16, stop=(stop,))]
        )
        assert batch[-1] == stopped


def test_an_eos_token_ends_its_row_only(lm: HFModel) -> None:
    """The tiny model never writes its real EOS, so the token it writes first is made one."""
    with torch.no_grad():
        logits = lm.model(torch.tensor([lm.tokenizer.encode(PROMPTS[2])])).logits
    first = int(logits[0, -1].argmax())
    as_eos = HFModel(lm.spec, lm.model, lm.tokenizer, lm.device)
    as_eos.eos_ids = (first,)
    other = GenerationRequest(PROMPTS[0], max_new_tokens=8)
    out, companion = as_eos.generate([GenerationRequest(PROMPTS[2], max_new_tokens=8), other])
    assert out.completion_tokens == 1
    assert companion.completion_tokens == 8 or companion.text.startswith(lm.decode([first]))
    assert out.text == lm.decode([first])  # not special to the tokenizer, so kept


@pytest.mark.integration
def test_token_counts_match_the_tokenizer(lm: HFModel) -> None:
    chat = lm.render(PROMPTS[1], chat=True, system="Be brief.")
    prompts = [*PROMPTS, chat]
    out = lm.generate([GenerationRequest(p, max_new_tokens=5) for p in prompts])
    assert [g.prompt_tokens for g in out] == [len(lm.tokenizer.encode(p)) for p in prompts]
    assert {g.completion_tokens for g in out} == {5}


def test_a_long_prompt_is_left_truncated_to_leave_room(lm: HFModel) -> None:
    long = " ".join(PROMPTS) * 12
    assert len(lm.tokenizer.encode(long)) > lm.max_length
    out = lm.generate([GenerationRequest(long, max_new_tokens=20)])[0]
    assert out.prompt_tokens == lm.max_length - 20
    assert out.completion_tokens == 20
    with pytest.raises(InputError, match="leaves no room"):
        lm.generate([GenerationRequest("x", max_new_tokens=lm.max_length)])


@pytest.mark.integration
def test_a_batch_never_outgrows_max_length(lm: HFModel) -> None:
    """A prompt truncated to leave room for 8 new tokens shares no batch with a request for
    100: together they would run past the position embeddings."""
    long = GenerationRequest(" ".join(PROMPTS) * 12, max_new_tokens=8)
    wide = GenerationRequest(PROMPTS[0], max_new_tokens=100)
    out = lm.generate([long, wide, GenerationRequest(PROMPTS[1], max_new_tokens=8)])
    assert [g.completion_tokens for g in out] == [8, 100, 8]
    assert out[1] == lm.generate([wide])[0]


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 4, "temperature": -1.0}, "temperature"),
        ({"max_new_tokens": 4, "top_p": 0.0}, "top_p"),
    ],
)
def test_bad_generation_requests_are_refused(kwargs: dict[str, float], problem: str) -> None:
    with pytest.raises(InputError, match=problem):
        GenerationRequest("x", **kwargs)  # type: ignore[arg-type]


def test_render(lm: HFModel, model_dir: Path, tmp_path: Path) -> None:
    assert lm.render("Q?", chat=False) == "Q?"
    assert lm.render("Q?", chat=False, system="S") == "S\n\nQ?"
    assert lm.render("Q?", chat=True) == "<|user|>Q?\n<|assistant|>"
    assert lm.render("Q?", chat=True, system="S") == "<|system|>S\n<|user|>Q?\n<|assistant|>"
    plain = shutil.copytree(model_dir, tmp_path / "plain")
    (plain / "chat_template.jinja").unlink()
    bare = HFModel.load(ModelSpec.parse(f"hf/{plain}"), "cpu")
    with pytest.raises(InputError, match="no template") as caught:
        bare.render("Q?", chat=True)
    assert "\n" not in str(caught.value)


# --- log-likelihood -----------------------------------------------------------------------

CHOICES = [
    ChoiceRequest("The quick brown fox", " jumps over"),
    ChoiceRequest("Question: what is two plus two? Answer:", " four"),
    ChoiceRequest("Question: what is two plus two? Answer:", " five"),
    ChoiceRequest("Paris is the capital of ", "France"),
    ChoiceRequest("one two three", " four five six seven"),
    ChoiceRequest("café", " naïve"),
    ChoiceRequest("", "one two"),
]


def reference(lm: HFModel, request: ChoiceRequest) -> tuple[float, bool, int]:
    """lm-eval's encoding done by hand: whitespace moves, then whole minus context."""
    context, cont = request.context, request.continuation
    if context == "":
        tokens = lm.tokenizer.encode(cont, add_special_tokens=False)
        bos = lm.tokenizer.bos_token_id
        score = direct_logprob(lm, [lm.tokenizer.eos_token_id if bos is None else bos], tokens)
        return (*score, len(tokens))
    stripped = context.rstrip()
    cont = context[len(stripped) :] + cont
    ctx = lm.tokenizer.encode(stripped)
    tokens = lm.tokenizer.encode(stripped + cont)[len(ctx) :]
    return (*direct_logprob(lm, ctx, tokens), len(tokens))


def test_loglikelihood_equals_a_direct_computation_in_any_batch_order(lm: HFModel) -> None:
    expected = [reference(lm, r) for r in CHOICES]
    for seed in range(3):
        order = list(range(len(CHOICES)))
        random.Random(seed).shuffle(order)
        got = lm.loglikelihood([CHOICES[i] for i in order])
        for i, score in zip(order, got, strict=True):
            logprob, greedy, tokens = expected[i]
            assert score.logprob == pytest.approx(logprob, abs=1e-5)
            assert (score.is_greedy, score.tokens) == (greedy, tokens)
    assert len({round(s.logprob, 4) for s in lm.loglikelihood(CHOICES)}) == len(CHOICES)


def test_trailing_whitespace_of_the_context_moves_to_the_continuation(lm: HFModel) -> None:
    moved, kept = lm.loglikelihood(
        [ChoiceRequest("The quick ", "brown"), ChoiceRequest("The quick", " brown")]
    )
    assert moved.logprob == pytest.approx(kept.logprob, abs=1e-5)
    assert (moved.tokens, moved.is_greedy) == (kept.tokens, kept.is_greedy)
    # scoring "brown" after a context ending in its own space token would differ
    ctx = lm.tokenizer.encode("The quick ")
    naive = direct_logprob(lm, ctx, lm.tokenizer.encode("The quick brown")[len(ctx) :])
    assert naive[0] != pytest.approx(moved.logprob, abs=1e-3)


def test_is_greedy_is_true_exactly_for_the_argmax_continuation(lm: HFModel) -> None:
    words = " ".join(PROMPTS).split()
    for context in [" ".join(words[i : i + 2]) for i in range(len(words) - 1)]:
        ctx = lm.tokenizer.encode(context)
        ids = list(ctx)
        for _ in range(2):
            with torch.no_grad():
                ids.append(int(lm.model(torch.tensor([ids])).logits[0, -1].argmax()))
        text = lm.decode(ids[len(ctx) :])
        if lm.tokenizer.encode(context + text)[len(ctx) :] == ids[len(ctx) :]:
            break
    else:
        pytest.fail("no context whose greedy continuation re-encodes to the same tokens")
    best, other, past = lm.loglikelihood(
        [
            ChoiceRequest(context, text),
            ChoiceRequest(context, "zq"),
            ChoiceRequest(context, text + " zq"),  # greedy at first, then not
        ]
    )
    assert best.is_greedy
    assert not other.is_greedy
    assert not past.is_greedy


def test_loglikelihood_truncates_from_the_left_at_max_length(lm: HFModel) -> None:
    short = HFModel(
        ModelSpec.parse(f"hf/{lm.spec.name}", {"max_length": "6"}),
        lm.model,
        lm.tokenizer,
        lm.device,
    )
    request = ChoiceRequest("one two three four five six seven eight", " nine ten")
    ctx = lm.tokenizer.encode(request.context)
    cont = lm.tokenizer.encode(request.context + request.continuation)[len(ctx) :]
    window = (ctx + cont)[-7:]
    expected = direct_logprob(lm, window[: -len(cont)], cont)
    got = short.loglikelihood([request])[0]
    assert got.logprob == pytest.approx(expected[0], abs=1e-5)
    assert got.logprob != pytest.approx(lm.loglikelihood([request])[0].logprob, abs=1e-3)


def test_a_bos_adding_tokenizer_gets_one_bos_whatever_the_text(bos_lm: HFModel) -> None:
    bos = bos_lm.tokenizer.bos_token_id
    assert bos_lm.tokenizer.encode("The")[0] == bos
    got = bos_lm.loglikelihood(CHOICES)
    for request, score in zip(CHOICES, got, strict=True):
        assert score.logprob == pytest.approx(reference(bos_lm, request)[0], abs=1e-5)
    # a text that already starts with <s> is encoded without another one (lm-eval's rule)
    marked, plain = bos_lm.loglikelihood(
        [ChoiceRequest(f"{BOS}The quick", " brown"), ChoiceRequest("The quick", " brown")]
    )
    assert marked.logprob == pytest.approx(plain.logprob, abs=1e-5)
    marked_gen, plain_gen = bos_lm.generate(
        [GenerationRequest(f"{BOS}The quick", 8), GenerationRequest("The quick", 8)]
    )
    assert marked_gen == plain_gen
    chat = bos_lm.render("Q?", chat=True)
    assert chat.startswith(BOS)
    out = bos_lm.generate([GenerationRequest(chat, 3), GenerationRequest("Q?", 3)])
    assert out[0].prompt_tokens == len(bos_lm.tokenizer.encode(chat)) - 1
    assert out[1].prompt_tokens == len(bos_lm.tokenizer.encode("Q?"))


# --- model specs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["hf/gpt2", "hf/org/model@main", "hf//abs/path/model", "hf/org/m@" + "a" * 40],
)
def test_spec_round_trips(text: str) -> None:
    spec = ModelSpec.parse(text, {"dtype": "bfloat16", "batch_size": "4", "max_length": "512"})
    assert str(spec) == text
    assert ModelSpec.parse(str(spec), spec.arg_items()) == spec
    assert ModelSpec.parse(text).args.batch_size == 16
    assert ModelSpec.parse(text).arg_items() == {}


def test_spec_fields() -> None:
    spec = ModelSpec.parse("hf/org/model@v1.0/", {"batch_size": "2"})
    assert (spec.provider, spec.name, spec.revision, spec.args.batch_size) == (
        "hf",
        "org/model",
        "v1.0/",
        2,
    )
    assert ModelSpec.parse("hf/org/model/").name == "org/model"


@pytest.mark.parametrize(
    ("text", "args", "problem"),
    [
        ("vllm/gpt-4", {}, "unknown provider 'vllm'"),
        ("openai/gpt-4", {}, "needs --model-arg base_url"),
        ("openai/gpt-4@v2", {"base_url": "http://h/v1"}, "takes no @revision"),
        (
            "openai/gpt-4",
            {"base_url": "http://h/v1", "dtype": "float16"},
            "unknown model arg 'dtype' for openai/",
        ),
        ("openai/gpt-4", {"base_url": "ftp://h/v1"}, "base_url"),
        ("openai/gpt-4", {"base_url": "http://user:pw@h/v1"}, "base_url"),
        (
            "openai/gpt-4",
            {"base_url": "http://h/v1", "api_key": "sk-1"},
            "'api_key' is never accepted",
        ),
        ("openai/gpt-4", {"base_url": "http://h/v1", "api_key_env": "lower"}, "api_key_env"),
        ("gpt2", {}, "unknown provider"),
        ("hf/", {}, "empty model name"),
        ("hf/@main", {}, "empty model name"),
        ("hf/gpt2@", {}, "empty revision"),
        ("hf/my model", {}, "whitespace"),
        (
            "hf/gpt2",
            {"device": "cuda"},
            "unknown model arg 'device' for hf/ models (declared: batch_size, dtype, max_length)",
        ),
        ("hf/gpt2", {"trust_remote_code": "true"}, "never accepted"),
        ("hf/gpt2", {"trust_remote_code": "false"}, "never accepted"),
        ("hf/gpt2", {"batch_size": "0"}, "batch_size='0'"),
        ("hf/gpt2", {"batch_size": "many"}, "batch_size='many'"),
        ("hf/gpt2", {"dtype": "int8"}, "dtype='int8'"),
        ("hf/gpt2", {"max_length": "-3"}, "max_length='-3'"),
    ],
)
def test_bad_specs_are_refused_in_one_line(text: str, args: dict[str, str], problem: str) -> None:
    with pytest.raises(InputError) as caught:
        ModelSpec.parse(text, args)
    message = str(caught.value)
    assert problem in message
    assert "\n" not in message
    assert "pw@" not in message
    assert "sk-1" not in message


def test_identity_of_a_local_folder_follows_its_weights(model_dir: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(model_dir, tmp_path / "m")
    spec = ModelSpec.parse(f"hf/{copy}")
    first = identity(spec)
    assert first.startswith("sha256:")
    assert identity(spec) == first == identity(ModelSpec.parse(f"hf/{model_dir}"))
    (copy / "README.md").write_text("notes")
    assert identity(spec) == first
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    changed = identity(spec)
    assert changed != first
    (copy / "tokenizer.json").write_text((copy / "tokenizer.json").read_text() + " ")
    assert identity(spec) not in (first, changed)
    with pytest.raises(InputError, match="revision applies to Hub ids"):
        identity(ModelSpec.parse(f"hf/{copy}@main"))


def test_identity_of_a_hub_id_is_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no folder named org/tiny here
    assert identity(ModelSpec.parse("hf/org/tiny")) == f"git:{commit}"
    assert identity(ModelSpec.parse("hf/org/tiny@main")) == f"git:{commit}"
    pinned = "f" * 40
    assert identity(ModelSpec.parse(f"hf/org/absent@{pinned}")) == f"git:{pinned}"
    with pytest.raises(InputError, match="not in the local Hugging Face cache"):
        identity(ModelSpec.parse("hf/org/absent"))
    assert os.getcwd() == str(tmp_path)
