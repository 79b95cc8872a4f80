"""A snapshot before the prompt's last token, where a regenerate forks (that token is
forwarded again for its logits): on a hybrid the regenerate replays nothing, where it
replayed everything since the last turn boundary (the generation prompt's tokens)."""

from __future__ import annotations

import pytest

from tests.conftest import TinyModels
from tests.engine.engine_runner import Runner, build_models, fresh_finished, greedy, user


@pytest.fixture(scope="session")
def models(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return build_models(tiny_models, tmp_path_factory)


def test_a_regenerate_on_a_hybrid_replays_nothing(models: dict) -> None:
    messages = (user("Tell me about the sea and the sky."),)
    with Runner() as runner:
        runner.load(models["hybrid"])
        first = runner.generate(messages, greedy(max_tokens=12))
        again = runner.generate(messages, greedy(max_tokens=12))
    assert again.stats is not None and first.stats is not None
    assert again.stats.replayed_tokens == 0
    assert again.stats.reused_tokens == first.stats.prompt_tokens - 1
    assert (
        again.token_ids
        == fresh_finished(models["hybrid"], messages, greedy(max_tokens=12)).token_ids
    )
