"""The default language-model corpus: simple English generated from small fact tables.

The text is written by `tiny_corpus()` from the tables below (counting, days, months,
letters, sums, colours, animal sounds and homes, opposites, short stories), deterministic
for a given seed, so data/tiny_corpus.txt can be regenerated and checked. The facts are
consistent across the corpus, so a small byte-level model trained for a couple of minutes
on a CPU learns some of them; `cloze_items()` turns the same tables into a 4-way
multiple-choice test of exactly those facts (the lm-eval task `harness_cloze`).
"""

from __future__ import annotations

import random
from collections.abc import Callable

CORPUS_VERSION = 1

NUMBERS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
).split()
DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
MONTHS = "January February March April May June July August September October November December".split()
LETTERS = list("abcdefghijklmnopqrstuvwxyz")
COLOURS = {
    "lemon": "yellow", "grass": "green", "sky": "blue", "snow": "white", "coal": "black", "tomato": "red",
    "carrot": "orange", "plum": "purple", "cloud": "grey", "banana": "yellow", "leaf": "green",
    "cherry": "red", "sea": "blue", "milk": "white", "crow": "black", "pumpkin": "orange",
}
SOUNDS = {
    "cow": "moo", "dog": "woof", "cat": "meow", "duck": "quack", "sheep": "baa", "owl": "hoot",
    "bee": "buzz", "horse": "neigh", "pig": "oink", "frog": "croak", "lion": "roar", "mouse": "squeak",
}
HOMES = {
    "fish": "a pond", "bird": "a nest", "bee": "a hive", "rabbit": "a burrow", "spider": "a web",
    "horse": "a stable", "dog": "a kennel", "bear": "a cave", "ant": "a hill", "pig": "a sty",
}
OPPOSITES = {
    "hot": "cold", "big": "small", "up": "down", "day": "night", "fast": "slow", "open": "closed",
    "old": "new", "light": "dark", "early": "late", "wet": "dry", "full": "empty", "high": "low",
}
NAMES = [("Ada", "she"), ("Bram", "he"), ("Cleo", "she"), ("Dov", "he"), ("Esme", "she"), ("Finn", "he"),
         ("Gita", "she"), ("Hugo", "he"), ("Iris", "she"), ("Jory", "he"), ("Kaya", "she"), ("Lars", "he")]
PLACES = {"market": "busy", "library": "quiet", "park": "green", "harbour": "windy", "bakery": "warm", "garden": "sunny"}
FRUITS = ["apples", "pears", "plums", "figs", "lemons", "cherries"]
ACTIVITIES = ["read a book", "played a game", "sang a song", "drew a map", "baked some bread", "fed the ducks"]


def _count(rng: random.Random) -> str:
    start = rng.randrange(0, 15)
    run = NUMBERS[start : start + rng.randrange(3, 7)]
    return "Let us count: " + ", ".join(run) + "."


def _cycle_sentences(names: list[str]) -> Callable[[random.Random], str]:
    def make(rng: random.Random) -> str:
        i = rng.randrange(len(names))
        steps = rng.randrange(2, 5)
        return " ".join(f"After {names[(i + s) % len(names)]} comes {names[(i + s + 1) % len(names)]}." for s in range(steps))

    return make


def _letters(rng: random.Random) -> str:
    start = rng.randrange(0, 21)
    return "The letters go " + ", ".join(LETTERS[start : start + rng.randrange(3, 6)]) + "."


def _sum(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randrange(2, 5)):
        a, b = rng.randrange(0, 11), rng.randrange(0, 11)
        if rng.random() < 0.5 and a + b <= 20:
            out.append(f"{NUMBERS[a].capitalize()} plus {NUMBERS[b]} is {NUMBERS[a + b]}.")
        else:
            a, b = max(a, b), min(a, b)
            out.append(f"{NUMBERS[a].capitalize()} minus {NUMBERS[b]} is {NUMBERS[a - b]}.")
    return " ".join(out)


def _facts(table: dict[str, str], template: str) -> Callable[[random.Random], str]:
    def make(rng: random.Random) -> str:
        keys = rng.sample(sorted(table), rng.randrange(2, 5))
        return " ".join(template.format(k=k, v=table[k]) for k in keys)

    return make


def _story(rng: random.Random) -> str:
    (name, pronoun), (friend, _) = rng.sample(NAMES, 2)
    place = rng.choice(sorted(PLACES))
    count, fruit = rng.randrange(2, 10), rng.choice(FRUITS)
    return (
        f"{name} went to the {place} to buy {NUMBERS[count]} {fruit}. The {place} was {PLACES[place]}. "
        f"There {pronoun} met {friend}, and together they {rng.choice(ACTIVITIES)}. "
        f"{name} came home with {NUMBERS[count]} {fruit}."
    )


PARAGRAPHS: dict[str, Callable[[random.Random], str]] = {
    "count": _count,
    "days": _cycle_sentences(DAYS),
    "months": _cycle_sentences(MONTHS),
    "letters": _letters,
    "sums": _sum,
    "colours": _facts(COLOURS, "The {k} is {v}."),
    "sounds": _facts(SOUNDS, "A {k} says {v}."),
    "homes": _facts(HOMES, "A {k} lives in {v}."),
    "opposites": _facts(OPPOSITES, "The opposite of {k} is {v}."),
    "story": _story,
}


def tiny_corpus(paragraphs: int = 3000, seed: int = 0) -> str:
    """The generated corpus: `paragraphs` paragraphs separated by blank lines (about 80 bytes each)."""
    rng = random.Random(seed)
    kinds = sorted(PARAGRAPHS)
    return "\n\n".join(PARAGRAPHS[rng.choice(kinds)](rng) for _ in range(paragraphs)) + "\n"


def _choice_item(rng: random.Random, kind: str, context: str, answer: str, pool: list[str]) -> dict:
    """One 4-way item: the answer and three distinct distractors from `pool`, shuffled."""
    choices = [answer, *rng.sample(sorted(set(pool) - {answer}), 3)]
    rng.shuffle(choices)
    return {"kind": kind, "context": context, "choices": choices, "label": choices.index(answer)}


def cloze_items(seed: int = 1) -> list[dict]:
    """Multiple-choice items over the corpus facts: {kind, context, choices (4), label}."""
    rng = random.Random(seed)
    items = []
    for names, kind in ((DAYS, "days"), (MONTHS, "months")):
        for i, name in enumerate(names):
            items.append(_choice_item(rng, kind, f"After {name} comes", names[(i + 1) % len(names)], names))
    for start in range(17):
        context = "Let us count: " + ", ".join(NUMBERS[start : start + 3]) + ","
        items.append(_choice_item(rng, "count", context, NUMBERS[start + 3], NUMBERS))
    for _ in range(40):
        a, b = rng.randrange(0, 11), rng.randrange(0, 11)
        if a + b <= 20:
            items.append(_choice_item(rng, "sums", f"{NUMBERS[a].capitalize()} plus {NUMBERS[b]} is", NUMBERS[a + b], NUMBERS))
    for table, template, kind in ((COLOURS, "The {k} is", "colours"), (SOUNDS, "A {k} says", "sounds"),
                                  (HOMES, "A {k} lives in", "homes"), (OPPOSITES, "The opposite of {k} is", "opposites")):
        for key in sorted(table):
            items.append(_choice_item(rng, kind, template.format(k=key), table[key], list(table.values())))
    return items
