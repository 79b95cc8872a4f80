"""One loaded model and its computed state: what the engine thread runs a request on.

A request renders its branch with the model's chat template, reuses the longest
prefix it can find (the live state, a cached sibling branch, the on-disk prompt cache:
engine/resume.py decides), rolls the state back to it exactly, prefills only the rest
in interruptible chunks and decodes (speculatively where it pays). Everything here runs
on the engine thread.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine import events as ev
from engine.block_drafter import CapturingForward
from engine.block_drafter_load import load_block_drafter
from engine.branch_cache import BranchCache
from engine.chat_template import ChatTemplateError, render_chat
from engine.config import EngineConfig
from engine.decoding import DecodeRequest, decode
from engine.draft_costs import AcceptanceModel, CostModel
from engine.drafter_pool import Member, choice_pools
from engine.drafters import Drafter, DraftModelDrafter
from engine.errors import ContextOverflow, EngineError
from engine.loader import LoadedModel
from engine.memory import MemoryBudget, MemoryUse
from engine.resume import plan_resume, resume
from engine.sequence import SequenceState, prefill
from engine.suffix_drafter import SuffixDrafter
from engine.thinking import ReplyStream, opens_thinking

log = logging.getLogger(__name__)

Emit = Callable[[ev.Event], None]
REPLY_SHARE = 4  # fitting the context leaves a reply min(max_tokens, 1 / REPLY_SHARE of it)


@dataclass
class Rendered:
    token_ids: list[int]
    boundaries: list[int]  # token positions where each message ends
    opens_thinking: bool = False  # the prompt ends inside a <think> block (Qwen3-Thinking)


class Session:
    def __init__(
        self,
        loaded: LoadedModel,
        draft: LoadedModel | None = None,
        cache_dir: Path | None = None,
        config: EngineConfig | None = None,
    ) -> None:
        """`config` gives the branch cache's budget (None: EngineConfig()); the runners
        were built with the rest of it by the loader."""
        config = config or EngineConfig()
        self.loaded = loaded
        self.runner = loaded.runner  # every forward goes through it (fused or plain)
        self.tokenizer = loaded.tokenizer
        self.state = self.runner.new_state()
        self.branches = BranchCache()
        self.memory = MemoryBudget(config.memory_budget_bytes)  # sets the branch cache's share
        self.prompt_cache = None
        if cache_dir is not None:
            from engine.prompt_cache import PromptCache  # only when persistence is wanted

            self.prompt_cache = PromptCache(cache_dir, loaded.fingerprint)
        self.conversation_id = ""
        self.costs = CostModel()
        self.lookup = SuffixDrafter()
        self.draft = draft
        self.draft_drafter = DraftModelDrafter(draft.runner) if draft is not None else None
        self.block_drafter, self.block_problem = load_block_drafter(
            config.block_drafter, loaded, config.drafter_compile
        )
        self.acceptance = acc = {kind: AcceptanceModel() for kind in ev.DrafterKind}
        if draft is not None:  # a drafted token's cost until one is timed: by weights' bytes
            acc[ev.DrafterKind.DRAFT_MODEL].prior_steps = draft.weight_bytes / loaded.weight_bytes
        draft_d, block_d, kind = self.draft_drafter, self.block_drafter, ev.DrafterKind
        self.block_pool, self.auto_pool = choice_pools(
            Member("lookup", self.lookup, acc[kind.LOOKUP]),
            Member("block", block_d, acc[kind.BLOCK]) if block_d is not None else None,
            Member("draft_model", draft_d, acc[kind.DRAFT_MODEL]) if draft_d is not None else None,
            block_in_auto=bool(config.auto_block),
        )
        self.template = self.tokenizer.chat_template  # None: plain text completion only
        self._warned_inexact = False

    # -- rendering --------------------------------------------------------------------
    def render(
        self,
        messages: tuple[ev.Message, ...],
        continue_last: bool,
        enable_thinking: bool | None = None,
        raw: bool = False,
    ) -> Rendered:
        if raw:
            return self.render_raw(messages)
        if self.template is None:
            raise EngineError(
                "This model has no chat template, so it only continues plain text: send it "
                "as a plain text completion (python -m engine generate --raw)."
            )
        dicts = [{"role": m.role, "content": m.content} for m in messages]
        kw: dict = {"bos_token": self.tokenizer.bos_token, "eos_token": self.tokenizer.eos_token}
        if enable_thinking is not None:  # unset, a template keeps its own default
            kw["enable_thinking"] = enable_thinking
        if continue_last:
            if not dicts or dicts[-1]["role"] != "assistant":
                raise EngineError("Continue needs a last assistant message to continue.")
            text = render_chat(self.template, dicts[:-1], add_generation_prompt=True, **kw)
            text += dicts[-1]["content"]
        else:
            text = render_chat(self.template, dicts, add_generation_prompt=True, **kw)
        ids, ends = self.tokenizer.encode_with_ends(text, add_special=self.tokenizer.add_bos)
        boundaries = []
        # Turn boundaries: where each prefix of the messages ends (the whole list too), so
        # the next turn or a regenerate can roll a recurrent state back to a snapshot; a
        # boundary is the number of tokens ending within the prefix. It only saves replay:
        # a prefix the template refuses (Qwen3's [system] alone) or renders otherwise has
        # none; only the whole conversation, rendered above, may fail the request.
        for i in range(1, len(dicts) + 1):
            try:
                prefix = render_chat(self.template, dicts[:i], add_generation_prompt=False, **kw)
            except ChatTemplateError:
                continue
            if prefix and text.startswith(prefix):
                n = bisect.bisect_right(ends, len(prefix))
                if 0 < n < len(ids):
                    boundaries.append(n)
        return Rendered(ids, boundaries, opens_thinking(text))

    def render_raw(self, messages: tuple[ev.Message, ...]) -> Rendered:
        """Plain text completion: the messages' texts joined as they are, BOS as the
        tokenizer says; each message's end is a turn boundary, as in a chat, and so is
        the position before the last token."""
        text = "".join(m.content for m in messages)
        ids, ends = self.tokenizer.encode_with_ends(text, add_special=self.tokenizer.add_bos)
        boundaries: list[int] = []
        length = 0
        for m in messages[:-1]:
            length += len(m.content)
            n = bisect.bisect_right(ends, length)
            if 0 < n < len(ids) and (not boundaries or n > boundaries[-1]):
                boundaries.append(n)
        # and one before the last token: a regenerate of this reply forks there (its first
        # logits come from the last token), where no later turn can mark it any more
        if len(ids) > 1 and (not boundaries or len(ids) - 1 > boundaries[-1]):
            boundaries.append(len(ids) - 1)
        return Rendered(ids, boundaries)

    def fit_context(self, cmd: ev.Generate) -> Rendered:
        """Render, leaving the reply room: min(max_tokens, a quarter of the context).

        When that does not fit, the oldest turns are dropped if allowed; a prompt that
        still fits runs with the room left (a reply that fills it finishes CONTEXT_FULL);
        one that leaves no room at all is refused.
        """
        messages = cmd.messages
        limit = cmd.settings.context_limit(self.loaded.config.context_length)
        headroom = min(cmd.settings.max_tokens, max(1, limit // REPLY_SHARE))
        full = limit == self.loaded.config.context_length
        holder = "the model holds" if full else "this chat's context length is"
        while True:
            rendered = self.render(
                messages,
                cmd.settings.continue_last,
                cmd.settings.enable_thinking,
                cmd.settings.raw,
            )
            num_tokens = len(rendered.token_ids)
            if num_tokens + headroom <= limit:
                return rendered
            droppable = [i for i, m in enumerate(messages) if m.role != "system"]
            if not cmd.settings.drop_oldest_turns or len(droppable) <= 1:
                if num_tokens < limit:
                    return rendered
                raise ContextOverflow(
                    f"This conversation needs {num_tokens} tokens but {holder} {limit}, "
                    "which leaves no room for a reply. Start a new chat, shorten or delete "
                    "earlier messages, or turn on 'drop the oldest turns' in the settings."
                )
            first = droppable[0]
            # drop the oldest user turn together with the reply that follows it
            cut = 2 if len(droppable) > 2 and messages[first + 1].role == "assistant" else 1
            messages = messages[:first] + messages[first + cut :]

    # -- one request --------------------------------------------------------------------
    def generate(self, cmd: ev.Generate, emit: Emit, should_stop: Callable[[], bool]) -> None:
        if should_stop():  # stopped while it waited in the queue: it never touches the state
            emit(ev.Finished(cmd.request_id, ev.FinishReason.STOPPED, "", (), None))
            return
        start = time.perf_counter()
        self._recover()
        rendered = self.fit_context(cmd)
        ids = rendered.token_ids
        if not ids:
            raise EngineError("Nothing to send: the rendered prompt is empty.")
        saved = self._enter_conversation(cmd.conversation_id)
        self.enforce_memory()  # the shares this request's parts keep to
        drafter, acceptance = self._drafter(cmd.settings.drafter)
        prompt_hidden: list[tuple[int, Any]] = []  # a block drafter's context, as prefilled
        forward: Any = self.runner
        if getattr(drafter, "wants_hidden", False):
            forward = CapturingForward(
                self.runner, lambda *rows: prompt_hidden.append(rows), getattr(drafter, "taps", ())
            )
        plan = plan_resume(self.state, ids, self.branches, saved)
        reused, replayed = plan.num_reused, plan.num_replayed
        # one progress over all the work the person waits for: the replay from a snapshot
        # to the fork (up to a whole prefill when none is left), then the prompt's new tokens
        total = replayed + len(ids) - plan.fork - plan.num_tail_rows

        def on_chunk(done: int) -> None:
            emit(ev.PrefillProgress(cmd.request_id, done, total, reused))

        emit(ev.PrefillProgress(cmd.request_id, 0, total, reused))
        self.state = resume(
            self.runner,
            self.state,
            plan,
            self.branches,
            chunk_size=self.runner.prefill_rows,
            on_chunk=on_chunk,
            should_stop=should_stop,
        )
        logits = None
        if self.state.offset < plan.fork:  # stopped during the replay: no tail was appended
            reused = plan.replay_from
        else:
            for pos in rendered.boundaries:
                self.state.mark(pos)
            logits = prefill(
                forward,
                self.state,
                ids[self.state.offset :],
                chunk_size=self.runner.prefill_rows,
                on_chunk=lambda done: on_chunk(replayed + done),
                should_stop=should_stop,
            )
        prefilled = self.state.offset - reused  # computed here: replayed, then prompt tokens
        replayed = min(replayed, prefilled)
        if logits is None:  # stopped: the state keeps exactly the chunks done
            prefill_s = time.perf_counter() - start
            stats = self._stats(cmd, ids, reused, prefilled, prefill_s, 0.0, 0, 0, 0, replayed)
            emit(ev.Finished(cmd.request_id, ev.FinishReason.STOPPED, "", (), stats))
            return
        # a continued message goes on as answer text; otherwise the <think> block is split off
        reply = ReplyStream(
            cmd.request_id,
            self.tokenizer,
            emit,
            detect=not (cmd.settings.continue_last or cmd.settings.raw),
            opened=rendered.opens_thinking,
        )
        req = DecodeRequest(
            settings=cmd.settings.sampling,
            max_tokens=cmd.settings.max_tokens,
            eos_ids=self.tokenizer.eos_ids,
            emit=reply.add,
            should_stop=should_stop,
            drafter=drafter,
            acceptance=acceptance,
            context_limit=cmd.settings.context_limit(self.loaded.config.context_length),
            prompt_hidden=prompt_hidden,
        )
        row = np.asarray(self.loaded.ops.to_numpy(logits))[-1]
        result = decode(self.runner, self.state, row, req, self.costs)
        # lookup sees every reply once: a decode that drafted with it has committed it there
        if drafter is None or all(drafter is not d for d in (self.lookup, self.block_pool)):
            self.lookup.begin(ids)
            self.lookup.commit(result.token_ids)
            self.lookup.end()
        reply.finish()
        ttft = result.first_token_time - start
        decode_s = max(result.end_time - result.first_token_time, 1e-9)
        n = len(result.token_ids)
        rate = (n - 1) / decode_s if n > 1 else 0.0
        stats = self._stats(
            cmd, ids, reused, prefilled, ttft, rate, n, result.drafted, result.accepted, replayed
        )
        stats = replace(stats, thinking_tokens=reply.num_thinking_tokens, verifies=result.verifies)
        ids_out = tuple(result.token_ids)
        emit(
            ev.Finished(cmd.request_id, result.reason, reply.answer, ids_out, stats, reply.thinking)
        )

    def _recover(self) -> None:
        """After a request that failed (out of memory, a bug): a forward that raised was
        undone by its state where that is exact, so the conversation's state is kept; a
        verify that failed left its recording open, and rolling it back is exact too.
        Only a state that says it could not undo the forward (a partly written sliding
        ring stays poisoned) is recomputed from the start."""
        for state in [self.state] + ([self.draft_drafter.state] if self.draft_drafter else []):
            if state.is_poisoned:
                log.warning("a previous request failed mid-forward; recomputing its state")
                state.reset()
            elif state.recording is not None:
                state.rollback(state.recording)

    def _stats(
        self,
        cmd: ev.Generate,
        ids: list[int],
        reused: int,
        prefilled: int,
        ttft: float,
        decode_tok_s: float,
        generated: int,
        drafted: int,
        accepted: int,
        replayed: int,
    ) -> ev.Stats:
        memory = self.enforce_memory()  # the request is over: back under the budget
        return ev.Stats(
            request_id=cmd.request_id,
            prompt_tokens=len(ids),
            generated_tokens=generated,
            reused_tokens=reused,
            prefilled_tokens=prefilled,
            replayed_tokens=replayed,
            ttft_s=ttft,
            prefill_tok_s=prefilled / ttft if ttft > 0 and prefilled else 0.0,
            decode_tok_s=decode_tok_s,
            drafted=drafted,
            accepted=accepted,
            context_tokens=self.state.offset + (1 if generated else 0),  # + the pending token
            context_length=cmd.settings.context_limit(self.loaded.config.context_length),
            kv_bytes=memory.kv,
            snapshot_bytes=memory.snapshots,
            branch_cache_bytes=memory.branch_cache,
            drafter_bytes=memory.drafter,
            memory_bytes=memory.total,
            memory_budget_bytes=memory.budget,
        )

    # -- memory -------------------------------------------------------------------------
    def set_memory_budget(self, max_bytes: int | None) -> MemoryUse:
        """The one budget over the state's parts (None: the default); evicts now."""
        self.memory.set_budget(max_bytes)
        return self.enforce_memory()

    def enforce_memory(self) -> MemoryUse:
        states = [self.state] + ([self.draft_drafter.state] if self.draft_drafter else [])
        live = [self.block_drafter] if self.block_drafter is not None else []
        return self.memory.enforce(states, self.branches, self.lookup, live)

    def _drafter(self, choice: str) -> tuple[Drafter | None, AcceptanceModel | None]:
        if choice == ev.DrafterKind.OFF:
            return None, None
        if not self.runner.verify_is_exact():
            # refuse rather than change the reply: plain decoding is the exact fallback
            if not self._warned_inexact:
                log.warning(
                    "speculative decoding is off: on this device and dtype a verify is "
                    "not exact for this model (BRANCHCHAT_DTYPE=float32 enables it)"
                )
                self._warned_inexact = True
            return None, None
        if choice == ev.DrafterKind.DRAFT_MODEL:
            if self.draft_drafter is None:
                raise EngineError(
                    "No draft model is loaded; pick one in the settings or use lookup."
                )
            return self.draft_drafter, self.acceptance[ev.DrafterKind.DRAFT_MODEL]
        if choice == ev.DrafterKind.BLOCK:
            if self.block_pool is None:
                raise EngineError(self.block_problem)
            return self.block_pool, self.block_pool.acceptance
        if choice == ev.DrafterKind.AUTO and self.auto_pool is not None:
            return self.auto_pool, self.auto_pool.acceptance
        return self.lookup, self.acceptance[ev.DrafterKind.LOOKUP]

    # -- persistent prompt cache ------------------------------------------------------------
    def _enter_conversation(self, conversation_id: str) -> SequenceState | None:
        """Save the conversation being left and load the state saved for the one entered
        (None: it is the current one, nothing is persisted, or no usable file)."""
        if conversation_id == self.conversation_id or self.prompt_cache is None:
            self.conversation_id = conversation_id
            return None
        if self.conversation_id:
            self.prompt_cache.save(self.conversation_id, self.state)
        self.conversation_id = conversation_id
        return self.prompt_cache.load(conversation_id, self.runner)

    def save(self) -> tuple[str, int] | None:
        if self.prompt_cache is None or not self.conversation_id or not self.state.offset:
            return None
        return self.prompt_cache.save(self.conversation_id, self.state)

    def calibrate(self) -> None:
        """Measure forward costs of 1..16 rows so the draft length is chosen from facts."""
        self.costs.calibrate(self.runner)
