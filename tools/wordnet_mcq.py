"""Real multiple-choice questions from WordNet 3.0 (Debian package ``wordnet-base``), offline.

Three relations, each a question set of its own (one tunes nothing on another):

* ``capitals``: "What is the capital of {country}?": the options are national capitals, the
  right one the capital WordNet places in that country (part holonym), the others capitals of
  other countries.
* ``countries``: "In which country is the city of {city}?": cities (instances of ``city``) and
  the country they are part of; distractors are other countries.
* ``categories``: "Which of these is a kind of {category}?": a hyponym of one of a fixed list of
  everyday categories against hyponyms of the others.

Every draw is seeded; the same seed gives the same file. Usage:
``python tools/wordnet_mcq.py capitals --count 200 --options 4 --seed 0 --out q.jsonl``
(then ``posdebias build --source mcq --data q.jsonl --out bench/capitals``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

WORDNET = Path("/usr/share/wordnet")
NATIONAL_CAPITAL = "national_capital"
CITY = "city"
#: Everyday categories for ``categories``: broad enough to have many one- or two-word members.
CATEGORIES = (
    "fish",
    "bird",
    "tree",
    "fruit",
    "vegetable",
    "dog",
    "insect",
    "flower",
    "musical_instrument",
    "tool",
    "vehicle",
    "building",
    "mineral",
    "dance",
)


@dataclass(frozen=True)
class Synset:
    offset: str
    words: tuple[str, ...]
    pointers: tuple[tuple[str, str], ...]  # (symbol, offset) to nouns


def read_nouns(root: Path = WORDNET) -> dict[str, Synset]:
    path = root / "data.noun"
    if not path.is_file():
        raise SystemExit(f"{path} not found: install WordNet 3.0 (apt-get install wordnet-base)")
    synsets: dict[str, Synset] = {}
    with path.open(encoding="latin-1") as handle:
        for line in handle:
            if line.startswith(" "):
                continue  # licence header
            fields = line.split(" | ")[0].split()
            offset, count = fields[0], int(fields[3], 16)
            words = tuple(fields[4 + 2 * i] for i in range(count))
            rest = fields[4 + 2 * count :]
            pointers = []
            for i in range(int(rest[0])):
                symbol, target, pos = rest[1 + 4 * i : 4 + 4 * i]
                if pos == "n":
                    pointers.append((symbol, target))
            synsets[offset] = Synset(offset, words, tuple(pointers))
    return synsets


def _name(word: str) -> str:
    text = word.replace("_", " ")
    return text.split("(")[0].strip()


def _first(synsets: dict[str, Synset], word: str, root: Path = WORDNET) -> Synset:
    """The most frequent noun sense of ``word`` (the first offset of its index.noun line)."""
    with (root / "index.noun").open(encoding="latin-1") as handle:
        for line in handle:
            fields = line.split()
            if fields and fields[0] == word:
                return synsets[fields[-int(fields[2])]]
    raise SystemExit(f"WordNet has no noun {word!r}")


def _targets(synset: Synset, symbol: str) -> list[str]:
    return [target for sym, target in synset.pointers if sym == symbol]


def _located(synsets: dict[str, Synset], kind: str) -> list[tuple[str, str]]:
    """(place, country) pairs: instances of ``kind`` with a part holonym that is a country."""
    kind_offset = _first(synsets, kind).offset
    country = {s.offset for s in synsets.values() if _is_country(synsets, s)}
    pairs = []
    for synset in synsets.values():
        if kind_offset not in _targets(synset, "@i"):
            continue
        holders = [t for t in _targets(synset, "#p") if t in country]
        if len(holders) == 1:
            pairs.append((_name(synset.words[0]), _name(synsets[holders[0]].words[0])))
    return pairs


def _is_country(synsets: dict[str, Synset], synset: Synset) -> bool:
    kinds = {_name(synsets[t].words[0]) for t in _targets(synset, "@i")}
    return bool(
        kinds
        & {
            "European country",
            "African country",
            "Asian country",
            "South American country",
            "country",
            "European nation",
            "African nation",
            "Asian nation",
            "island",
        }
    ) and any(sym == "%p" for sym, _ in synset.pointers)


def questions(relation: str, count: int, options: int, seed: int) -> Iterator[dict]:
    synsets = read_nouns()
    rng = random.Random(seed)
    if relation in ("capitals", "countries"):
        pairs = _located(synsets, NATIONAL_CAPITAL if relation == "capitals" else CITY)
        # one question per country (capitals) / city (countries); unique answers
        seen: dict[str, tuple[str, str]] = {}
        for place, country in sorted(pairs):
            key = country if relation == "capitals" else place
            seen.setdefault(key, (place, country))
        pool = sorted(seen.values())
        rng.shuffle(pool)
        answers = sorted({c if relation == "countries" else p for p, c in pool})
        for index, (place, country) in enumerate(pool[:count]):
            right = place if relation == "capitals" else country
            others = [a for a in answers if a != right]
            if relation == "countries":  # a country that holds no such city is no distractor
                others = [a for a in others if a != country]
            wrong = rng.sample(others, options - 1)
            yield _item(
                relation, index, country if relation == "capitals" else place, right, wrong, rng
            )
        return
    members = {}
    for category in CATEGORIES:
        root = _first(synsets, category)
        found, stack = set(), [root.offset]
        while stack:
            for child in _targets(synsets[stack.pop()], "~"):
                if child not in found:
                    found.add(child)
                    stack.append(child)
        members[category] = sorted(
            {_name(synsets[o].words[0]) for o in found if "_" not in synsets[o].words[0]}
        )
    everyone = {name for names in members.values() for name in names}
    index = 0
    while index < count:
        category = rng.choice(CATEGORIES)
        right = rng.choice(members[category])
        others = sorted(everyone - set(members[category]))
        yield _item(relation, index, _name(category), right, rng.sample(others, options - 1), rng)
        index += 1


def _item(
    relation: str, index: int, subject: str, right: str, wrong: list[str], rng: random.Random
) -> dict:
    texts = [*wrong, right]
    rng.shuffle(texts)
    question = {
        "capitals": f"What is the capital of {subject}?",
        "countries": f"In which country is the city of {subject}?",
        "categories": f"Which of these is a kind of {subject}?",
    }[relation]
    return {
        "id": f"{relation}-{index}",
        "question": question,
        "options": texts,
        "answer": texts.index(right) + 1,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("relation", choices=("capitals", "countries", "categories"))
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--options", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = list(questions(args.relation, args.count, args.options, args.seed))
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    print(f"{len(rows)} questions -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
