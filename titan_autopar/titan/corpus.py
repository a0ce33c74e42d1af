"""A built-in English-like text corpus, generated from fixed word lists with a fixed seed.

Owns `generate_documents`: short documents of simple sentences ("Mara carried the warm bread to
the table."), each document keeping to one topic so that words co-occur the way they do in real
text and a small language model has something to learn. Same seed, same documents, on every
machine: only `random.Random` with an integer seed is used, whose sequence Python keeps stable.
Nothing is downloaded; the word lists below are the whole source.
"""

from __future__ import annotations

import random

NAMES = ("Mara", "Tomas", "Ines", "Pavel", "Lena", "Omar", "Greta", "Jonas", "Ada", "Felix",
         "Nora", "Hugo", "Clara", "Viktor", "Selma", "Arlo")

# topic -> (nouns, adjectives, verbs in the past tense that take an object, places)
TOPICS = {
    "kitchen": (("bread", "soup", "knife", "table", "kettle", "onion", "plate", "oven", "apple",
                 "spoon", "cheese", "pot"),
                ("warm", "fresh", "sharp", "heavy", "sweet", "clean", "old", "golden"),
                ("cut", "washed", "carried", "tasted", "cooked", "placed", "found", "cleaned"),
                ("kitchen", "pantry", "market", "garden")),
    "sea": (("boat", "wave", "harbor", "net", "sail", "fish", "rope", "island", "lighthouse",
             "gull", "anchor", "shell"),
            ("blue", "wet", "salty", "calm", "wild", "distant", "bright", "grey"),
            ("pulled", "watched", "repaired", "tied", "sailed", "painted", "followed", "caught"),
            ("harbor", "shore", "bay", "dock")),
    "city": (("street", "train", "bridge", "tower", "window", "bus", "shop", "clock", "lamp",
              "ticket", "square", "station"),
             ("busy", "narrow", "tall", "quiet", "new", "crowded", "broken", "red"),
             ("crossed", "passed", "opened", "closed", "counted", "visited", "noticed", "fixed"),
             ("city", "station", "square", "museum")),
    "school": (("book", "letter", "lesson", "pencil", "map", "desk", "story", "number",
                "question", "teacher", "page", "chalk"),
               ("long", "short", "difficult", "simple", "careful", "small", "yellow", "clever"),
               ("read", "wrote", "answered", "copied", "explained", "drew", "learned", "checked"),
               ("classroom", "library", "school", "hall")),
    "forest": (("tree", "river", "path", "stone", "fox", "leaf", "branch", "hill", "owl",
                "mushroom", "fire", "tent"),
               ("green", "dark", "tall", "cold", "silent", "mossy", "deep", "gentle"),
               ("climbed", "crossed", "gathered", "heard", "lit", "carried", "watched", "found"),
               ("forest", "valley", "camp", "meadow")),
}

TIMES = ("in the morning", "at noon", "in the evening", "at night", "after the rain",
         "before dinner", "on Sunday", "last winter", "every day", "once again")
LINKS = ("Then", "Later", "After that", "Soon", "Meanwhile", "Still", "At last")
PREPS = ("to", "near", "behind", "beside", "under", "across", "into", "from")


def _noun_phrase(rng: random.Random, nouns, adjectives) -> str:
    noun = rng.choice(nouns)
    if rng.random() < 0.5:
        return f"the {rng.choice(adjectives)} {noun}"
    return f"the {noun}"


def _sentence(rng: random.Random, topic: str, name: str) -> str:
    nouns, adjectives, verbs, places = TOPICS[topic]
    kind = rng.randrange(5)
    if kind == 0:
        s = (f"{name} {rng.choice(verbs)} {_noun_phrase(rng, nouns, adjectives)} "
             f"{rng.choice(PREPS)} {_noun_phrase(rng, nouns, adjectives)}")
    elif kind == 1:
        s = f"The {rng.choice(nouns)} was {rng.choice(adjectives)} and {rng.choice(adjectives)}"
    elif kind == 2:
        s = (f"{rng.choice(TIMES).capitalize()}, {name} {rng.choice(verbs)} "
             f"{_noun_phrase(rng, nouns, adjectives)} in the {rng.choice(places)}")
    elif kind == 3:
        s = (f"{rng.choice(LINKS)} {name} saw {rng.randrange(2, 13)} {rng.choice(nouns)}s "
             f"{rng.choice(PREPS)} the {rng.choice(places)}")
    else:
        other = rng.choice([n for n in NAMES if n != name])
        s = (f"\"Look at {_noun_phrase(rng, nouns, adjectives)},\" {name} said to {other}, "
             f"and {other} {rng.choice(verbs)} it")
    return s + "."


def generate_documents(n_docs: int, seed: int = 0) -> list[str]:
    """`n_docs` documents of 3 to 9 sentences, the same for the same `n_docs` and `seed`."""
    if n_docs < 1:
        raise ValueError(f"n_docs must be at least 1, got {n_docs}")
    rng = random.Random(seed)
    topics = sorted(TOPICS)
    docs = []
    for _ in range(n_docs):
        topic = rng.choice(topics)
        name = rng.choice(NAMES)
        docs.append(" ".join(_sentence(rng, topic, name) for _ in range(rng.randrange(3, 10))))
    return docs
