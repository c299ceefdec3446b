"""A model provider of the registry tests' own (``echo/NAME``): its loader lives here, so the
test can watch the registry import it on first use only."""

from __future__ import annotations

from collections.abc import Sequence

from evalq.shared.lm.request import Generation, GenerationRequest
from evalq.shared.lm.spec import ModelSpec
from evalq.shared.services import Services


class EchoModel:
    """Answers every prompt with its model name and the prompt, upper-cased."""

    def __init__(self, spec: ModelSpec, device: str, services: Services | None) -> None:
        self.spec, self.device, self.services = spec, device, services

    def render(self, prompt: str, *, chat: bool, system: str | None = None) -> str:
        return prompt

    def generate(
        self, requests: Sequence[GenerationRequest], runs: Sequence[str] | None = None
    ) -> list[Generation]:
        return [
            Generation(f"{self.spec.name}:{str(r.prompt).upper()}", len(str(r.prompt)), 1)
            for r in requests
        ]


def load(spec: ModelSpec, device: str, services: Services | None, cache: bool) -> EchoModel:
    return EchoModel(spec, device, services)
