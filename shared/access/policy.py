"""The tier rules: every rule about split tiers, and nothing else, lives in this module (and
which models and few-shot splits a caller may name, the same kind of gate).

Who may evaluate a split, who may read what of a run (and of its timing), how a stored or
missing tier reads, and how a policy file's budgets reconcile with tiers. Stores
(``TierRegistry``, ``Ledger``) only persist; submit, the clients, ``status``, ``report`` and
every other path call the functions here, which fail closed: anything unlisted, unreadable or
unknown is ``no_access``. The roles are :mod:`evalq.shared.access.roles`', how an aggregate is
released is :mod:`evalq.shared.access.ladder`'s, and :mod:`evalq.shared.access.disclosure` applies
them all to one read of a run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from evalq.shared.choices import Tier
from evalq.shared.errors import LabelRefusedError, PolicyError, TierRefusedError
from evalq.shared.models import Progress, RunMeta, RunStatus

if TYPE_CHECKING:
    from evalq.shared.lm.limits import EndpointLimits
    from evalq.shared.lm.spec import ModelArgs
    from evalq.shared.lm.task import TaskSpec

__all__ = [
    "MIN_AGGREGATE_SAMPLES",
    "TIMING_GRAIN",
    "Access",
    "Reader",
    "Tier",
    "admit_fewshot",
    "admit_model",
    "admit_prompt",
    "admit_run",
    "admit_sample_choice",
    "admit_source",
    "admit_split",
    "budgeted_tier",
    "coarse_timing",
    "read_access",
    "run_tier",
    "server_draws",
    "stored_tier",
    "suggests_datasets",
]

MIN_AGGREGATE_SAMPLES = 5
"""k-anonymity floor: a non-admin never evaluates, nor sees an aggregate over, fewer samples of
a ``non_viewable`` split (single-sample evals would reveal labels)."""


class Access(StrEnum):
    """What a reader may see of a run."""

    FULL = "full"
    AGGREGATE = "aggregate"
    NONE = "none"


def stored_tier(raw: object) -> Tier:
    """How a split's stored tier reads: missing (unlisted) or unrecognised is ``no_access``."""
    if raw is None:
        return Tier.NO_ACCESS
    try:
        return Tier(str(raw))
    except ValueError:
        return Tier.NO_ACCESS


def run_tier(listed: Tier, registered: bool) -> Tier:
    """The tier a run's split reads as: its registered dataset's (``listed``), and
    ``no_access`` for a source that is not registered, whatever a tier under its name says."""
    return listed if registered else Tier.NO_ACCESS


def admit_source(where: str, registered: bool, admin: bool) -> None:
    """Before anything is read: a source that is not a registered dataset (a path, a Hub id,
    an unknown name) is ``no_access``, so only an admin evaluates it."""
    if not admin and not registered:
        raise TierRefusedError(
            f"tier refused: {where} is not a registered dataset (unregistered sources are "
            "no_access; an admin registers them with evalq datasets add)"
        )


def suggests_datasets(admin: bool, sees_sources: bool) -> bool:
    """Whether an unknown dataset name's error may suggest a registered name that is close
    (``did you mean 'reviews'?``): for an admin (``--admin``, an admin token) or an operator
    holding Redis, who may list every dataset anyway; a user's typo teaches it of no dataset."""
    return admin or sees_sources


def admit_split(where: str, tier: Tier, admin: bool) -> None:
    """Before anything is read or charged: refuse a ``no_access`` split to a non-admin."""
    if not admin and tier is Tier.NO_ACCESS:
        raise TierRefusedError(f"tier refused: {where} is no_access")


def admit_grader(where: str, tier: Tier, admin: bool, graded: bool) -> None:
    """A grader model reads each sample's target, and what it spends (its tokens, which the
    run's progress and the split's token budget count) follows what it read and said: on a
    split that is not ``viewable`` a ``model_graded`` task would tell a caller more of its
    labels than the release rule releases. Only an admin runs one there."""
    if graded and not admin and tier is not Tier.VIEWABLE:
        raise TierRefusedError(
            f"tier refused: {where} is {tier.value}, and a model_graded task's grader tokens "
            "follow each target; only an admin runs one there"
        )


def admit_fewshot(where: str, tier: Tier) -> None:
    """Few-shot examples are rows shown with their answers, so they come only from a
    ``viewable`` split, for every caller, admins included: a held-out split's labels never
    reach a prompt (nor an output that might echo them)."""
    if tier is not Tier.VIEWABLE:
        raise TierRefusedError(
            f"tier refused: few-shot examples come only from a viewable split, and {where} "
            f"is {tier.value}"
        )


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def admit_model(name: str, admin: bool, roots: Sequence[Path]) -> None:
    """A model a caller names is a Hub id (``org/name``) or a folder inside one of the
    operator's model roots (``EVALQ_MODEL_ROOTS``); only an admin may name any folder: a
    caller cannot make the workers read a folder of its choosing. ``name`` is canonical
    (:func:`evalq.shared.lm.spec.canonical`: a folder by its resolved path, links followed)."""
    if admin:
        return
    path = Path(name)
    if path.is_absolute():
        if any(path.is_relative_to(root.resolve()) for root in roots):
            return
        listed = ", ".join(str(root) for root in roots) or "none set"
        raise TierRefusedError(
            f"model refused: {name} is not inside a model root (EVALQ_MODEL_ROOTS: {listed})"
        )
    if not _HUB_ID.match(name) or ".." in name.split("/"):
        raise TierRefusedError(
            f"model refused: {name!r} is neither a Hub id (org/name) nor an absolute folder"
        )


def admit_endpoint(url: str, args: ModelArgs, listed: EndpointLimits | None) -> None:
    """An endpoint model calls only a server the operator listed in the policy's
    ``endpoints:``, with no longer ``timeout`` or higher ``concurrency`` than it allows,
    whoever asks (admins too: the workers would send that server their API key, and a slow
    server's requests hold worker processes and token budgets). Which key goes with its
    requests is the entry's alone (none unless it names ``api_key_env``); a caller's
    ``api_key_env`` is a check that must name the same variable."""
    if listed is None:
        raise TierRefusedError(
            f"model refused: endpoint {url} is not listed in the policy's endpoints: "
            "(an operator lists it with evalq policy apply)"
        )
    refused = listed.refusal(url, args)
    if refused is not None:
        raise TierRefusedError(f"model refused: {refused}")


def admit_prompt(name: str, task: TaskSpec, labels: frozenset[str]) -> None:
    """A task shows the model each field its prompt and its ``choices`` name; none may be in
    ``labels``, the label fields of every registered task and loaded evaluation
    (:class:`evalq.shared.store.labels.LabelFields`): a split's label fields reach no prompt,
    whichever task names them (``rate`` showing ``{answer}`` read ``solve``'s held-out
    answers). On every split and for every caller, admins too: the workers scrub the same set
    from rows before inference, so such a run could only fail sample by sample."""
    shown = (*task.fields, *(() if task.choices is None else (task.choices,)))
    for field in shown:
        if field in labels:
            raise LabelRefusedError(
                f"task refused: '{name}' shows the model field '{field}', a label field of a "
                "registered task or evaluation (label fields reach no prompt)"
            )


def server_draws(tier: Tier, admin: bool) -> bool:
    """Whether the server, not the caller, picks a run's samples: on a ``non_viewable`` split
    a non-admin run is the whole split or a subset drawn from a secret random source, whose ids
    the caller never sees (ids chosen by the caller let runs be differenced sample by sample,
    Denning, Denning & Schwartz 1979)."""
    return not admin and tier is Tier.NON_VIEWABLE


def admit_sample_choice(where: str, tier: Tier, admin: bool, ids_given: bool) -> None:
    """Before anything is read: ``--ids`` on a split where the server draws is refused."""
    if ids_given and server_draws(tier, admin):
        raise TierRefusedError(
            f"tier refused: {where} is non_viewable: its samples are drawn by the server "
            "(give --limit N for a random subset, or nothing for the whole split), not --ids"
        )


def admit_run(where: str, tier: Tier, admin: bool, samples: int) -> None:
    """Once the sample ids are resolved, before the ledger: the split's tier and the
    k-anonymity floor must allow a run of ``samples`` samples."""
    admit_split(where, tier, admin)
    if not admin and tier is Tier.NON_VIEWABLE and samples < MIN_AGGREGATE_SAMPLES:
        raise TierRefusedError(
            f"tier refused: {where} is non_viewable; a run needs at least "
            f"{MIN_AGGREGATE_SAMPLES} samples, this one has {samples}"
        )


@dataclass(frozen=True)
class Reader:
    """What one reader may see of one run, and why not when it may not."""

    where: str
    """``dataset/split`` of the run."""
    tier: Tier
    """The split's tier as the policy resolves it."""
    access: Access
    """What this reader gets."""
    admin: bool = False
    """The reader is an admin (or an operator acting as one)."""

    @property
    def bypasses(self) -> bool:
        """An admin reading a split that is not ``viewable``: allowed, and audited."""
        return self.admin and self.tier is not Tier.VIEWABLE

    @property
    def sees_error_kinds(self) -> bool:
        """Error kinds (exception class names, chosen by whatever code raised them: a
        candidate's code too) are per-sample detail: counts by stage for everyone else."""
        return self.access is Access.FULL

    @property
    def withheld(self) -> str | None:
        """Why the aggregate is not shown, or None when it is."""
        if self.access is not Access.NONE:
            return None
        if self.tier is Tier.NON_VIEWABLE:
            return f"fewer than {MIN_AGGREGATE_SAMPLES} samples of a non_viewable split"
        return f"{self.where} is {self.tier.value}"

    @property
    def sees_timing(self) -> bool:
        """When a run's samples settled (its timeline, throughput, ETA, live counts, exact
        times) is per-sample data too: a scorer slower on a wrong answer writes each label
        into it (the attack review read 178 of 200 off the report's throughput chart). Only a
        reader with per-sample access sees it; everyone else sees the run as a whole, on a
        grain of :data:`TIMING_GRAIN` (:func:`coarse_timing`)."""
        return self.access is Access.FULL

    def require_samples(self) -> None:
        """Per-sample results (outputs, scores, score distributions) and samples' rows (their
        inputs and targets, as ``--with-input`` and the report's lowest-scoring samples show
        them) need full access: raise :class:`TierRefusedError` otherwise."""
        if self.access is not Access.FULL:
            raise TierRefusedError(
                f"tier refused: {self.where} is {self.tier.value}; "
                "per-sample results are not readable (use status for the aggregate)"
            )


def read_access(where: str, tier: Tier, admin: bool, samples: int) -> Reader:
    """What a reader (admin or not) gets of a run of ``samples`` samples on a split of
    ``tier``: everything on ``viewable`` or as admin, the aggregate of a ``non_viewable`` run
    at or above the floor, nothing otherwise."""
    if admin or tier is Tier.VIEWABLE:
        allowed = Access.FULL
    elif tier is Tier.NON_VIEWABLE and samples >= MIN_AGGREGATE_SAMPLES:
        allowed = Access.AGGREGATE
    else:
        allowed = Access.NONE
    return Reader(where, tier, allowed, admin)


TIMING_GRAIN = 1.0
"""Seconds: the grain of a run's times for a reader who does not see its timing."""


def coarse_timing(meta: RunMeta, progress: Progress, now: float) -> tuple[RunMeta, Progress]:
    """A run's record and counters as a reader who does not see its timing
    (:attr:`Reader.sees_timing`) reads them at ``now`` (Redis's clock): its creation rounded
    down to :data:`TIMING_GRAIN`; its end shown only from the next multiple of the grain after
    it (until then the run reads as running, so polling ``status`` learns its end to the
    grain, not to the sample); no counts while it goes (each settling write would show), and
    ``running`` from submission on (the moment of its first write would show too), and no
    grader's tokens (they follow the targets it read). Its
    archiving time, which follows its end by milliseconds, is on the grain too; why it failed,
    without the exception's kind and message (``aggregate() failed``: an aggregate over
    labels may say a label in its error; its kind is an admin's to read)."""
    created = math.floor(meta.created / TIMING_GRAIN) * TIMING_GRAIN
    # its archiving follows its end by milliseconds: shown on the grain too, and not before
    archived = None if meta.archived is None else _grain_after(meta.archived)
    seen = {"created": created, "archived": archived if archived and now >= archived else None}
    if meta.finished is None:
        if meta.status.active:
            going = {**seen, "archived": None, "status": RunStatus.RUNNING}
            return meta.model_copy(update=going), Progress()
        return meta.model_copy(update=seen), progress
    end = _grain_after(meta.finished)
    if now < end:
        going = {**seen, "archived": None, "finished": None, "reason": None}
        return meta.model_copy(update={**going, "status": RunStatus.RUNNING}), Progress()
    reason = None if meta.reason is None else meta.reason.split(":", 1)[0]
    # a grader's tokens follow the targets it read (:func:`admit_grader`)
    counts = progress.model_copy(update={"grader_prompt_tokens": 0, "grader_completion_tokens": 0})
    return meta.model_copy(update={**seen, "finished": end, "reason": reason}), counts


def _grain_after(moment: float) -> float:
    return math.ceil(moment / TIMING_GRAIN) * TIMING_GRAIN


def budgeted_tier(where: str, listed: Tier | None) -> tuple[Tier | None, str | None]:
    """Reconcile a budget with the split's tier (``None`` = unlisted) when a policy file gives
    the split a budget: return the tier to set (None = leave it) and a warning, if any.

    A split no tier was set for (``no_access`` by default) becomes ``non_viewable``; one set
    ``no_access`` cannot be budgeted; ``viewable`` is allowed with a warning (a budget meters
    compute, not information).
    """
    if listed is None:
        made = "budgeted with no tier set (no_access), made non_viewable"
        return Tier.NON_VIEWABLE, f"{where}: {made}"
    if listed is Tier.NO_ACCESS:
        raise PolicyError(f"{where}: a no_access split cannot have a budget")
    if listed is Tier.VIEWABLE:
        return None, f"{where}: budgeted but viewable (labels readable)"
    return None, None
