"""What submitting a registered language task adds to a run: the task as registered now, the
model the caller named (checked against the policy), and the few-shot examples drawn once.

A Python evaluation owns its model and is created by name; a name that is no Python
evaluation is looked up among the registered tasks (``evalq tasks add``), and the caller must
name the model it runs on (``--model``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from evalq.shared.access.policy import admit_endpoint, admit_fewshot, admit_model, admit_prompt
from evalq.shared.access.registry import DatasetRegistry
from evalq.shared.access.task import RegisteredTask
from evalq.shared.access.tasks import TaskRegistry
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.data.loading import spec_of
from evalq.shared.data.remote import DataCache
from evalq.shared.errors import InputError, TierRefusedError, UnknownEvalError
from evalq.shared.evals.endpoints import loglikelihoods_refused
from evalq.shared.evals.harness import HarnessTask
from evalq.shared.evals.language import LanguageTask, language_run
from evalq.shared.evaluation import Evaluation, create, registered
from evalq.shared.lm.harness import HarnessRun, HarnessSpec
from evalq.shared.lm.providers import provider
from evalq.shared.lm.run import Example, LanguageRun
from evalq.shared.lm.spec import ModelSpec, canonical, present
from evalq.shared.lm.task import TaskSpec, fewshot_indices
from evalq.shared.models import RunMeta
from evalq.shared.names import PLUGIN_NAME
from evalq.shared.store.endpoints import EndpointRegistry
from evalq.shared.store.labels import LabelFields
from evalq.shared.store.requests import RequestStore

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = [
    "Resolved",
    "check_rows",
    "check_split",
    "prepare_harness",
    "rescorer",
    "resolve",
    "with_examples",
]

Resolved = tuple[Evaluation, LanguageRun | HarnessRun | None]
"""The evaluation a request names, and its run's record when it is a registered task (a YAML
language task's or an lm-eval task's)."""


def _task(client: redis.Redis, name: str) -> RegisteredTask:
    """The registered task ``name``, refused when what it shows the model names a label field
    of any registered task or loaded evaluation (:func:`admit_prompt`), before anything else
    is read or charged."""
    tasks = TaskRegistry(client)
    found = tasks.get(name) if PLUGIN_NAME.match(name) else None
    if found is None:
        raise UnknownEvalError(name, [*registered(), *(t.name for t in tasks.all())])
    if isinstance(found.spec, TaskSpec):
        admit_prompt(name, found.spec, LabelFields(client).all())
        found.spec.check_scorer()  # with this process's scorers, which may have changed since
    return found


def resolve(
    client: redis.Redis,
    name: str,
    params: Mapping[str, str],
    model: str | None,
    model_args: Mapping[str, str],
    *,
    admin: bool,
    model_roots: Sequence[Path],
) -> Resolved:
    """The evaluation ``name`` means, with the task's run when it is a registered task (its
    examples not drawn yet: :func:`with_examples`). :class:`InputError` (one line) for a
    ``--model`` given to a Python evaluation or missing for a task; the policy's refusal for
    a model the caller may not name."""
    if name in registered():
        if model is not None:
            raise InputError(
                f"'{name}' is a Python evaluation: it loads its own model (--model is for "
                "registered tasks: evalq tasks list)"
            )
        return create(name, params), None
    task = _task(client, name)
    if model is None:
        raise InputError(
            f"task '{name}' runs on a model: add --model hf/<folder or Hub id> or "
            "--model openai/<name> --model-arg base_url=…"
        )
    spec = canonical(ModelSpec.parse(model, model_args))
    if isinstance(task.spec, HarnessSpec):
        spec = _harness_model(client, name, task.spec, spec, admin=admin, model_roots=model_roots)
        harness = HarnessRun(harness=task.spec, model=spec, num_fewshot=0, split="")
        return HarnessTask(name, harness, params), harness
    _admit_grader(client, task.spec)
    if task.spec.choices is not None and not provider(spec.provider).loglikelihoods:
        raise InputError(
            f"task '{name}' is multiple choice: a YAML task reads log-likelihoods from "
            f"local models only, not {spec.provider}/ ones (an lm-eval multiple-choice task "
            "runs on an endpoint model that answers them)"
        )
    if spec.args.tokenizer is not None:
        raise InputError(
            f"model arg tokenizer is for lm-eval tasks (their log-likelihood requests), not "
            f"task '{name}'"
        )
    if spec.endpoint is not None:
        _admit(client, spec)
    else:
        admit_model(spec.name, admin, model_roots)
        spec = present(spec)
    run = LanguageRun(task=task.spec, model=spec)
    return LanguageTask(name, run, params), run


def rescorer(
    client: redis.Redis, source: RunMeta, name: str, params: Mapping[str, str]
) -> Resolved:
    """The evaluation that scores ``source``'s stored outputs again under the name ``name``:
    a Python evaluation by name, or a registered task on the source's model and few-shot
    examples (the outputs were made with them; only the scorer and the target are the new
    task's). Whether it can read those outputs is the output kinds' question."""
    if name in registered():
        return create(name, params), None
    task = _task(client, name)
    made = language_run(source)
    if isinstance(task.spec, HarnessSpec):
        raise InputError(
            f"task '{name}' is an lm-eval task: rescoring with it is not supported yet"
        )
    if made is None:
        raise InputError(
            f"task '{name}' scores language runs' outputs; run {source.run_id} is the Python "
            f"evaluation '{source.eval}'s"
        )
    _admit_grader(client, task.spec)
    run = made.model_copy(update={"task": task.spec})
    return LanguageTask(name, run, params), run


def _admit(client: redis.Redis, spec: ModelSpec) -> None:
    """Refuse an endpoint model whose server the policy does not list (with its key), or asks
    more of it than its entry allows."""
    if spec.endpoint is not None:
        listed = EndpointRegistry(client).get(spec.endpoint)
        admit_endpoint(spec.endpoint, spec.args, listed)


LOGLIKELIHOOD_TYPES = frozenset({"multiple_choice", "loglikelihood", "loglikelihood_rolling"})
"""lm-eval output types whose requests read log-likelihoods."""


def _harness_model(
    client: redis.Redis,
    name: str,
    task: HarnessSpec,
    spec: ModelSpec,
    *,
    admin: bool,
    model_roots: Sequence[Path],
) -> ModelSpec:
    """The model an lm-eval task runs on, admitted: a local folder or Hub id as any local
    model; an endpoint listed in the policy, with its tokenizer (``--model-arg tokenizer=``,
    admitted as a model folder) when the task reads log-likelihoods: refused in one line
    otherwise. Whether the server answers them is asked later (:func:`prepare_harness`),
    once the caller is admitted to the split."""
    if spec.endpoint is None:
        admit_model(spec.name, admin, model_roots)
        return present(spec)
    _admit(client, spec)
    if spec.args.tokenizer is not None:
        tokenizer = canonical(ModelSpec(provider="hf", name=spec.args.tokenizer))
        admit_model(tokenizer.name, admin, model_roots)
        args = spec.args.model_copy(update={"tokenizer": present(tokenizer).name})
        spec = spec.model_copy(update={"args": args})
    if task.output_type not in LOGLIKELIHOOD_TYPES:
        return spec
    if spec.args.tokenizer is None:
        raise InputError(
            f"task '{name}' reads log-likelihoods: an endpoint model needs its tokenizer "
            "(--model-arg tokenizer=FOLDER), as lm-eval's local-completions does"
        )
    return spec


def _admit_grader(client: redis.Redis, task: TaskSpec) -> None:
    """Refuse a ``model_graded`` task whose grader's server the policy does not list."""
    if task.grader is not None:
        _admit(client, canonical(ModelSpec.parse(task.grader.model, task.grader.model_args)))


def with_examples(
    client: redis.Redis,
    run: LanguageRun,
    *,
    dataset: str,
    registered: bool,
    split: str,
    data_cache: DataCache | None = None,
) -> LanguageRun:
    """``run`` with its few-shot examples drawn from the task's few-shot split of the same
    dataset, a registered one (``registered``), checked viewable: ``n`` rows, one more when
    it is the evaluated split (a sample never sees its own row); ``data_cache``: where an
    object-store source's copies are kept."""
    fewshot = run.task.fewshot
    if fewshot is None or fewshot.n == 0:
        return run
    if not registered:  # an unregistered source has no tiers: nothing says a split is viewable
        raise InputError(
            "few-shot examples come from a registered dataset's viewable split: register the "
            "source (evalq datasets add) and submit with --dataset"
        )
    record = DatasetRegistry(client).get(dataset)
    if record is None:
        raise InputError(f"unknown dataset '{dataset}'")
    source = record.source(fewshot.split)  # a split it lacks: one line naming its splits
    tier = TierRegistry(client).resolve(dataset, fewshot.split)
    admit_fewshot(f"{dataset}/{fewshot.split}", tier)
    same = fewshot.split == split
    _, rows = spec_of(source, fewshot.split, cache=data_cache)
    chosen = fewshot_indices(len(rows), fewshot.n + (1 if same else 0), fewshot.seed)
    examples = tuple(Example(row_id=i, row=dict(rows[i])) for i in chosen)
    return run.model_copy(update={"examples": examples, "same_split": same})


def prepare_harness(  # noqa: PLR0913 - the run, its split and its rows, each named
    client: redis.Redis,
    run: HarnessRun,
    *,
    dataset: str,
    registered: bool,
    split: str,
    rows: Dataset,
    sample_ids: Sequence[int],
    num_fewshot: int | None,
    data_cache: DataCache | None = None,
) -> tuple[HarnessRun, dict[str, bytes]]:
    """An lm-eval task's run on ``dataset/split`` (its documents ``rows``), with every
    sample's requests built once, here, as lm-eval builds them in one process (its few-shot
    sampler and seed; :func:`evalq.shared.lm.lmeval.build_requests`), encoded as they are
    stored (:class:`evalq.shared.store.requests.RequestStore`); on an endpoint model, the
    server of a task that reads log-likelihoods is asked one first
    (:func:`loglikelihoods_refused`: refused in one line when it answers none). Few-shot
    examples come from the task's few-shot split of the same dataset, which must be a
    registered, viewable split other than the evaluated one: :class:`TierRefusedError` (exit
    3), one line, before anything is charged, otherwise."""
    from evalq.shared.lm.lmeval_runtime import build_requests, build_task

    spec = run.harness
    if run.model.endpoint is not None and spec.output_type in LOGLIKELIHOOD_TYPES:
        refused = loglikelihoods_refused(run.model, client)
        if refused is not None:
            raise InputError(
                f"lm-eval task '{spec.lm_eval}' reads log-likelihoods, which "
                f"{run.model.endpoint} did not answer (/completions with echo and logprobs): "
                f"{refused}"
            )
    shots = spec.num_fewshot or 0
    if num_fewshot is not None and spec.num_fewshot != 0:  # lm-eval keeps a config's 0
        shots = num_fewshot
    fewshot = spec.fewshot_split if shots > 0 else None
    fewshot_rows = None
    where = f"{dataset}/{fewshot}"
    if fewshot is not None:
        if fewshot == split:
            raise TierRefusedError(
                f"refused: lm-eval task '{spec.lm_eval}' draws its few-shot examples from "
                f"'{split}', the evaluated split: an example would show a sample's own label"
            )
        if not registered:
            raise InputError(
                "few-shot examples come from a registered dataset's viewable split: register "
                "the source (evalq datasets add) and submit with --dataset"
            )
        record = DatasetRegistry(client).named(dataset)
        if fewshot not in record.splits:
            raise TierRefusedError(
                f"refused: lm-eval task '{spec.lm_eval}' draws its few-shot examples from "
                f"'{fewshot}', which {dataset} does not have"
            )
        admit_fewshot(where, TierRegistry(client).resolve(dataset, fewshot))
        _, fewshot_rows = spec_of(record.source(fewshot), fewshot, cache=data_cache)
    run = run.model_copy(update={"num_fewshot": shots, "split": split, "fewshot_split": fewshot})
    # another task's labels never reach a prompt (what admit_prompt checks of a YAML task); the
    # task's own target fields stay for lm-eval's doc_to_target
    others = sorted((LabelFields(client).all() - set(spec.labels)) & set(rows.column_names))
    task = build_task(run, rows.remove_columns(others), fewshot_rows)
    if len(task.eval_docs) != len(rows):
        raise InputError(
            f"lm-eval task '{spec.lm_eval}': its process_docs keeps {len(task.eval_docs)} of "
            f"the split's {len(rows)} rows (documents that are not rows: not supported yet)"
        )
    fields, digest = RequestStore.encoded(build_requests(task, sample_ids))
    return run.model_copy(update={"requests_digest": digest}), fields


def check_split(
    client: redis.Redis,
    task: TaskSpec,
    dataset: str,
    split: str,
    data_cache: DataCache | None = None,
) -> None:
    """Refuse (exit 2, one line) a task that ``dataset/split``, a registered split, cannot
    feed or score, on every row (:func:`check_rows`), and a few-shot split the dataset lacks:
    what ``evalq tasks add --dataset D --split S`` checks before registering (admins only:
    the values at fault are shown); ``data_cache``: where an object-store source's copies are
    kept."""
    record = DatasetRegistry(client).named(dataset, suggest=True)
    _, rows = spec_of(record.source(split), split, cache=data_cache)
    check_rows(task, rows, range(len(rows)), shown=True)
    if task.fewshot is not None:
        record.source(task.fewshot.split)


def check_rows(
    task: TaskSpec, rows: Sequence[Mapping[str, Any]], sample_ids: Sequence[int], *, shown: bool
) -> None:
    """Refuse, before anything is charged or run, a task the split cannot feed or score: a
    field its prompt or choices need that the split's rows lack (checked on its first row),
    and a sample whose target its scorer cannot score (:meth:`TaskSpec.target_problem`, on
    every sample of ``sample_ids``: ``numeric`` needs a number). One line; the value at
    fault and which sample holds it only when ``shown`` (the caller may read the rows)."""
    if not sample_ids:
        return
    first = rows[0]
    label_free = {k: v for k, v in first.items() if k not in task.label_fields}
    task.fill(label_free, "the split's rows")
    if task.choices is not None and task.choices not in first:
        raise InputError(f"the split's rows have no choices field '{task.choices}'")
    task.label(first)
    bad: list[tuple[int, str, Any]] = []
    for i in sample_ids:
        found = task.target_problem(rows[i])
        if found is not None:
            bad.append((i, *found))
    if not bad:
        return
    i, problem, value = bad[0]
    if shown:
        more = f" (and {len(bad) - 1} more of the run's samples)" if len(bad) > 1 else ""
        raise InputError(f"sample {i}: {problem}: {_short(value)}{more}")
    raise InputError(f"{len(bad)} of the run's {len(sample_ids)} samples: {problem}")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
