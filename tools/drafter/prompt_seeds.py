"""Short seeds for the user turns the target writes itself (self_prompts.py): a seed only
starts a turn or steers it; the words of the turn are the target's. Plain data and one
draw function; the held-out prompts (bench/heldout_prompts.json) are checked against
every sampled turn, not avoided here.

Kinds (SHARES): `open` (the template's own system message, nothing else), `topic` (a
steering system message naming a domain, used while sampling only: the training prompt
gets the template's default), `opener` (the turn starts with a few words, kept; half of
them steered to a domain too), `system` (a custom system message, kept, as 15% of the
hand-built prompts have) and `multi` (an earlier exchange of prompt_pools.EXCHANGES,
kept, then the new turn).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tools.drafter import prompt_pools as pools

SHARES = {"open": 0.15, "topic": 0.25, "opener": 0.35, "system": 0.1, "multi": 0.15}

# fmt: off
DOMAINS = [
    'cooking', 'baking', 'gardening', 'personal finance', 'budgeting', 'investing', 'travel',
    'fitness', 'running', 'nutrition', 'mental health', 'sleep', 'parenting', 'pets', 'dogs',
    'cats', 'home repair', 'plumbing', 'woodworking', 'photography', 'painting', 'drawing',
    'music theory', 'guitar', 'piano', 'movies', 'television', 'books', 'poetry',
    'creative writing', 'grammar', 'learning languages', 'Spanish', 'French', 'Japanese',
    'history', 'ancient Rome', 'world war two', 'geography', 'astronomy', 'physics',
    'chemistry', 'biology', 'genetics', 'medicine', 'first aid', 'mathematics', 'algebra',
    'geometry', 'calculus', 'statistics', 'probability', 'economics', 'marketing',
    'small business', 'job interviews', 'resumes', 'careers', 'public speaking',
    'productivity', 'time management', 'relationships', 'friendship', 'weddings',
    'philosophy', 'ethics', 'religion', 'law', 'politics', 'climate', 'weather', 'the ocean',
    'animals', 'insects', 'plants', 'cars', 'bicycles', 'airplanes', 'trains', 'space travel',
    'robots', 'artificial intelligence', 'machine learning', 'data science', 'databases',
    'SQL', 'Python', 'JavaScript', 'web development', 'HTML and CSS', 'Linux', 'the command line',
    'git', 'cloud computing', 'cybersecurity', 'passwords', 'networking', 'smartphones',
    'video games', 'board games', 'sports', 'football', 'basketball', 'tennis', 'chess',
    'fashion', 'skin care', 'architecture', 'interior design', 'cleaning', 'recycling',
    'camping', 'hiking', 'fishing', 'birds', 'dinosaurs', 'volcanoes', 'mythology',
    'fairy tales', 'jokes', 'riddles', 'holidays', 'birthdays', 'email etiquette',
    'customer service', 'shopping', 'renting an apartment', 'moving house', 'taxes',
    'insurance', 'education', 'studying for exams', 'college applications', 'teaching',
]
STEERS = [
    'The user is curious about {d}.', 'The user wants help with {d}.',
    'The user asks a question about {d}.', 'The user is a beginner in {d}.',
    'The user wants a list of ideas about {d}.', 'The user needs advice on {d}.',
]
OPENERS = [
    'Write', 'Explain', 'How do I', 'What is the difference between', 'Can you help me',
    'List', 'Give me', 'Why', 'What are some', 'Summarize', 'Translate', 'Compare',
    'Write a short story about', 'I need', 'Tell me', 'Create a', 'Describe', 'Is it true that',
    'What would happen if', 'Rewrite this sentence', 'Plan a', 'Suggest', 'Could you',
    "I'm trying to", 'Help me write', 'What is the best way to', 'How does', 'Can you explain',
    'Write a poem about', 'What are the steps to', 'Give me a list of', 'Make a',
    'Write a {lang} function that', 'Write a {lang} program that',
    'How do I fix this {lang} error:',
    'What does this {lang} code do?\n\n```{fence}\n', 'Here is my {lang} code:\n\n```{fence}\n',
    'In {lang}, how do I', 'Explain the difference between two {lang}',
    'Write a SQL query that', 'Write a bash script that',
]
SYSTEMS = [
    *pools.SYSTEM_PROMPTS,
    'You are a helpful assistant.', 'You are a patient math teacher.',
    'You are a travel agent who suggests itineraries.', 'You are a professional editor.',
    'You are a coding assistant. Answer with code first.', 'You are a helpful cooking assistant.',
]
# fmt: on


@dataclass(frozen=True)
class Seed:
    kind: str
    context: tuple[dict, ...]  # messages kept before the sampled user turn
    steer: str | None  # a system message while sampling only (the prompt gets the default)
    opener: str  # the start of the user turn, kept


def _language(rng: random.Random) -> tuple[str, str]:
    lang = rng.choice(pools.LANGUAGES)
    fence = {"C++": "cpp", "C#": "csharp"}.get(lang, lang.lower())
    return lang, fence


def draw_seed(rng: random.Random) -> Seed:
    """One seed, drawn by SHARES."""
    kind = rng.choices(list(SHARES), weights=list(SHARES.values()))[0]
    steer = rng.choice(STEERS).format(d=rng.choice(DOMAINS))
    if kind == "open":
        return Seed(kind, (), None, "")
    if kind == "topic":
        return Seed(kind, (), steer, "")
    if kind == "opener":
        lang, fence = _language(rng)
        opener = rng.choice(OPENERS).format(lang=lang, fence=fence)
        coded = "{lang}" in opener or "SQL" in opener or "bash" in opener
        return Seed(kind, (), steer if rng.random() < 0.5 and not coded else None, opener)
    if kind == "system":
        return Seed(kind, ({"role": "system", "content": rng.choice(SYSTEMS)},), None, "")
    pairs = rng.sample(pools.EXCHANGES, 2 if rng.random() < 1 / 3 else 1)
    context = tuple(
        {"role": role, "content": text}
        for user, reply in pairs
        for role, text in (("user", user), ("assistant", reply))
    )
    return Seed(kind, context, None, "")
