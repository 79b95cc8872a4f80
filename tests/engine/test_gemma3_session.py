"""The real Gemma 3 270M (base, served as plain text completion) through the Engine: a
20-turn session growing well past the 512-token sliding window, with edits and
regenerates forking more than a window before the end (the ring cannot rewind that far:
a snapshot or a replay from the start must be exact) and switches back to earlier
branches. Every reply equals a fresh session's, and the reuse figures stay within what
the live state shares with the prompt.

The fresh reply comes from a new Session on a second, separately loaded model: nothing
of the engine under test, nor of any earlier request, is shared with it (a brand-new
Engine per request would spend its model load ~30 times). The deepest edit is checked
once more against a brand-new Engine (fresh_finished).
"""

from __future__ import annotations

import pytest

from engine import events as ev
from engine.branch_cache import BranchCache, common_prefix
from engine.config import EngineConfig
from engine.loader import LoadedModel, load_model
from engine.model_catalog import GEMMA3_270M
from engine.session import Session
from engine.state import SnapshotPolicy
from tests.engine.engine_runner import (
    Runner,
    always_draft,
    assert_same_reply,
    assistant,
    fresh_finished,
    greedy,
    user,
)

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(
        not GEMMA3_270M.is_present(),
        reason="Gemma 3 270M is not downloaded (python -m engine fetch gemma3-270m)",
    ),
]

WINDOW = 512  # the sliding layers' window (checked against the loaded config)
SLACK = SnapshotPolicy().sliding_slack  # the engine's default: rows a ring rewinds itself
SETTINGS = greedy("lookup", max_tokens=6, raw=True)
# follow-ups on one page of notes; each ~45-60 tokens, none a repeat of another
TEXTS = (
    "Notes from a week on the northern coast, written each evening in a small notebook "
    "bought at the station.\n\nMonday: the ferry left at dawn, an hour late because the "
    "crew waited for a delivery of mail, and the",
    "\n\nTuesday: we walked for three hours along the cliff path to the old lighthouse. "
    "It has not been used since the sixties, but a retired keeper still lives in the "
    "cottage beside it, and he told us that in winter",
    "\n\nWednesday: rain all morning, so we spent it in the town museum. The best room "
    "holds sea charts and a map from 1742, drawn by a Dutch captain, which showed the "
    "harbour",
    "\n\nThursday: the fishermen mended their nets on the quay while the gulls waited. "
    "Two of them argued for an hour, half in jest, about whether the cod this year were "
    "smaller because",
    "\n\nFriday: a storm came in from the west just after breakfast. The ferry was "
    "cancelled, the shops closed their shutters, and by noon the waves broke over the",
    "\n\nSaturday: the market filled the square before eight. It sold smoked mackerel, "
    "dark rye bread, cloudberry jam in tiny jars and a brown cheese that tasted",
    "\n\nSunday: quiet at last. The church bells rang twice, once for the service and "
    "once, the baker's daughter explained while wrapping our loaf, for",
    "\n\nA note on the birds, since several friends asked: puffins nest on the outer "
    "cliffs from April to August, and the guide on the boat trip said that their numbers",
    "\n\nOn the food, which deserves its own page: every guesthouse we stayed in served "
    "porridge with butter and salt, never with sugar, and when I asked why the answer was "
    "always",
    "\n\nThe second week began with a slow train ride inland. For hours we passed "
    "forests of birch and pine, lakes as still as glass, and villages where",
    "\n\nIn the old mining town the copper tunnels are open to visitors in summer. Our "
    "guide, a retired engineer with a lamp on his helmet, told us that the deepest shaft",
    "\n\nThe river below the town freezes hard in December. The children then skate to "
    "school along it, and the teachers keep a rope by the door in case",
    "\n\nOn Wednesday we met a violin maker in a workshop full of shavings. He showed us "
    "how spruce for the tops is dried for seven years, and he said the secret of a good "
    "instrument is",
    "\n\nThe weather turned mild for the first time since we arrived, and the whole town "
    "seemed to move outdoors at once. Farmers were cutting hay on the "
    "steep slopes by hand, hanging it on wooden racks to dry, and the smell of it",
    "\n\nOn the last evening, after a long lunch of reindeer stew and lingonberries at the "
    "inn by the bridge, we packed early, paid the landlady, and then climbed the "
    "hill above the town with a flask of coffee and two blankets to watch the sun, which "
    "at this time of year barely sets, and",
    "\n\nLooking back over these pages on the ferry home, three weeks and some two "
    "thousand kilometres later, with the coast slowly "
    "disappearing behind us, the thing I remember best is not the scenery, grand as it "
    "was, but the people we met along the way:",
    "\n\nPractical advice for anyone planning the same journey, whether in summer as we "
    "did or in the dark months, since the guidebooks "
    "leave most of it out: bring wool socks and a good raincoat, carry cash for the "
    "smaller ferries, which take no cards, and book",
    "\n\nA short list of words we learned, with apologies for the spelling, which we "
    "never quite mastered, from the landlady's grandson, who tested us "
    "at every breakfast: 'fjell' for mountain, 'bukt' for bay, 'takk' for thank you, and "
    "one more that means",
    "\n\nIf I went again, and I hope to within a few years, perhaps with the children "
    "once they are old enough for the long walks, I would skip the mining town, spend "
    "less time on trains, and stay longer on the outer islands, where there are no cars "
    "at all, the houses are painted red and ochre, and the light in June",
    "\n\nFinally, because several people have asked for it since we came back and "
    "because it is the one thing from the trip I cook at home every week, the recipe the "
    "landlady wrote out for us on our last morning, in "
    "pencil on the back of a ferry timetable, for the fish soup we ate almost every "
    "night of the trip: start with a stock of",
)
EDITS = (  # for the 2nd and the 6th user text
    "\n\nTuesday: the lighthouse was closed for repairs, so instead we took a small "
    "boat across the sound to the seal colony, where",
    "\n\nSaturday: a folk festival filled the square with dancers in embroidered "
    "costumes, fiddlers on a cart, and",
)


@pytest.fixture(scope="module")
def reference() -> LoadedModel:
    return load_model(GEMMA3_270M.path(), EngineConfig(backend="numpy"))


def fresh_reply(reference: LoadedModel, messages: tuple[ev.Message, ...]) -> ev.Finished:
    """What a new Session (no state, no branch cache, no lookup index) replies."""
    events: list[ev.Event] = []
    command = ev.Generate("fresh", messages, greedy(max_tokens=6, raw=True))
    Session(reference).generate(command, events.append, lambda: False)
    assert isinstance(events[-1], ev.Finished), events[-1]
    return events[-1]


class Chat:
    """The engine under test, each request checked against a fresh session.

    A model with sliding layers keeps no branch tails (a ring takes no appended rows), so
    the live state is the only source of reuse: a request reuses at most its common
    prefix with the prompt (the fork), all of it when the ring's slack reaches back to it.
    """

    def __init__(self, runner: Runner, reference: LoadedModel) -> None:
        self.runner, self.reference = runner, reference
        self.figures: list[tuple[str, int, int, int, int]] = []

    def ids(self, messages: tuple[ev.Message, ...]) -> list[int]:
        return Session(self.reference).render_raw(messages).token_ids

    def send(self, label: str, messages: tuple[ev.Message, ...]) -> tuple[ev.Finished, int]:
        """The reply and its fork (the last prompt token is always forwarded)."""
        ids, live = self.ids(messages), self.runner.state_tokens()
        fork = min(common_prefix(live, ids), len(ids) - 1)
        reply = self.runner.generate(messages, SETTINGS)
        stats = reply.stats
        assert stats is not None
        assert stats.prompt_tokens == len(ids)
        assert stats.reused_tokens + stats.prefilled_tokens == len(ids)
        assert stats.reused_tokens <= fork  # never past what the live state shares
        assert stats.replayed_tokens == fork - stats.reused_tokens  # replayed up to the fork
        if len(live) - fork <= SLACK:
            assert stats.reused_tokens == fork
        if fork > 0:
            assert stats.reused_tokens > 0
        assert self.runner.state_tokens()[: len(ids)] == ids
        assert_same_reply(reply, fresh_reply(self.reference, messages))
        self.figures.append((label, len(ids), fork, stats.reused_tokens, stats.replayed_tokens))
        return reply, fork

    def follow(self, label: str, branch: tuple[ev.Message, ...], text: str) -> tuple:
        """One more turn on `branch`: the reply to it plus `text`, appended."""
        messages = (*branch, user(text))
        reply, _ = self.send(label, messages)
        return (*messages, assistant(reply.text))

    def deep_edit(self, label: str, messages: tuple[ev.Message, ...]) -> ev.Finished:
        """A request forking more than a window before the live state's end; its reuse
        comes from a snapshot at or before the fork: one at every turn boundary and every
        `stride` tokens, so it replays at most `stride` tokens."""
        live = len(self.runner.state_tokens())
        reply, fork = self.send(label, messages)
        assert live - fork > WINDOW, (label, live, fork)
        assert reply.stats is not None
        assert reply.stats.replayed_tokens <= SnapshotPolicy().stride
        return reply


def test_twenty_turns_with_deep_edits_equal_a_fresh_engine(
    reference: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    always_draft(monkeypatch)  # regenerates and switches verify drafts on the sliding ring
    assert reference.config.sliding_window == WINDOW
    with Runner("numpy") as runner:
        runner.load(GEMMA3_270M.path())
        chat = Chat(runner, reference)
        branch_a: tuple[ev.Message, ...] = ()
        for n, text in enumerate(TEXTS[:14], start=1):
            branch_a = chat.follow(f"turn {n}", branch_a, text)

        # edit the 2nd user text (~60 tokens in, ~560 before the end), then regenerate it
        branch_b = (*branch_a[:2], user(EDITS[0]))
        chat.deep_edit("edit 2", branch_b)
        regenerated, _ = chat.send("regenerate edit 2", branch_b)
        assert regenerated.stats is not None
        assert regenerated.stats.prefilled_tokens == 1  # the ring rewinds one token itself
        branch_b = (*branch_b, assistant(regenerated.text))

        # back to A with new turns: recomputed from the fork with B (no tails kept)
        session = runner.engine.session
        assert session is not None and not BranchCache.supports(session.state)
        for n, text in enumerate(TEXTS[14:17], start=15):
            branch_a = chat.follow(f"turn {n}", branch_a, text)

        # regenerate the 4th reply (a branch ending at the 4th user text), then back to A
        chat.deep_edit("regenerate reply 4", branch_a[:7])
        for n, text in enumerate(TEXTS[17:20], start=18):
            branch_a = chat.follow(f"turn {n}", branch_a, text)
        assert len(chat.ids(branch_a)) > 1000

        # edit the 6th user text, ~780 tokens before the end; then back to B with a turn
        deepest = chat.deep_edit("edit 6", (*branch_a[:10], user(EDITS[1])))
        chat.follow("back to B", branch_b, TEXTS[2])
    for figure in chat.figures:  # shown with -s: label, prompt, fork, reused, replayed
        print(*figure)
    branch = (*branch_a[:10], user(EDITS[1]))
    assert_same_reply(deepest, fresh_finished(GEMMA3_270M.path(), branch, SETTINGS))
