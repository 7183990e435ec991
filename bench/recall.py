"""Memory search: does it find what was said, and how fast with 100k chunks indexed.

Ten identities each say 30 facts about themselves, each in a session of its
own among everyday chatter (distractors that share words with the facts),
then ask about each fact in other words. recall@5: the share of questions whose
fact's session is among the first five hits. Questions are written three ways:
sharing a key word with the fact, sharing only a rarer one, or sharing none
(a synonym: what lexical search cannot find, and an embedding model would).

Latency: the same search with the index grown to ``--chunks`` chunks (other
identities' chatter), p50 and p95 of 200 searches, through a real Redis and the
same Recall class a Hands worker uses.

Run: .venv/bin/python bench/recall.py [--chunks 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bus.redis_server import EmbeddedRedis  # noqa: E402
from bus.settings import RedisSettings  # noqa: E402
from bus.streams import Bus  # noqa: E402
from memory.recall import Recall  # noqa: E402
from memory.sessions import SessionStore, TranscriptEntry  # noqa: E402

# (fact, question sharing a key word, question sharing a rarer word, question sharing none)
FACTS = [
    ("My gym locker is number {n}.",
     "which locker do I use?", "what is my gym number?",
     "where do I keep my stuff when I work out?"),
    ("My dentist is Dr. {name}.",
     "who is my dentist?", "which doctor looks after my teeth?",
     "who fixes my teeth?"),
    ("The wifi password at home is {word}-{n}.",
     "what is the wifi password?", "how do I get on the home network? password?",
     "how do guests get online here?"),
    ("My sister {name} has her birthday on {date}.",
     "when is my sister's birthday?", "when was {name} born?",
     "what day should I call my sibling to celebrate?"),
    ("The car's licence plate is {plate}.",
     "what is my licence plate?", "what plate is on the car?",
     "what is the registration of my vehicle?"),
    ("I am allergic to {food}.",
     "what am I allergic to?", "what food gives me an allergy?",
     "what should I never eat?"),
    ("My passport expires in {month} {year}.",
     "when does my passport expire?", "passport validity?",
     "when do I need a new travel document?"),
    ("The spare key is under the {thing} by the door.",
     "where is the spare key?", "where did we hide the key?",
     "how do I get in if I am locked out?"),
    ("My bank branch is on {name} Street.",
     "where is my bank branch?", "which street is the bank on?",
     "where do I go to open an account?"),
    ("I take my {drug} pills at {hour} every morning.",
     "when do I take my pills?", "what time is my {drug}?",
     "when is my medication due?"),
    ("My bike is locked in the {place} behind the house.",
     "where is my bike?", "where is the bike locked?",
     "where did I park my bicycle?"),
    ("Our landlord is called {name}.",
     "what is our landlord's name?", "who is the landlord?",
     "who owns our flat?"),
    ("The boiler was serviced on {date}.",
     "when was the boiler serviced?", "last boiler service?",
     "when did someone last check the heating?"),
    ("My shoe size is {n2}.",
     "what is my shoe size?", "what size shoes do I wear?",
     "which size should I order trainers in?"),
    ("The kids' school starts at {hour}.",
     "when does the school start?", "what time is school?",
     "when must the children be in class?"),
    ("My blood type is {blood}.",
     "what is my blood type?", "which blood group am I?",
     "what should I tell a hospital before a transfusion?"),
    ("The cat's vet is {name} Veterinary.",
     "who is the cat's vet?", "which vet do we use?",
     "where do we take the kitten when it is ill?"),
    ("I parked the car on level {n2} of the garage.",
     "which level did I park on?", "where is the car in the garage?",
     "where did I leave the vehicle?"),
    ("My employee number is {n}.",
     "what is my employee number?", "what is my staff id number?",
     "what do I type at the office badge machine?"),
    ("The plumber's phone is {phone}.",
     "what is the plumber's phone number?", "how do I call the plumber?",
     "who do I ring about a leaking pipe?"),
    ("My favourite wine is {wine}.",
     "what is my favourite wine?", "which wine do I like?",
     "what should I bring to a dinner party to drink?"),
    ("The recycling is collected every {day}.",
     "when is the recycling collected?", "which day is recycling?",
     "when do I put the bins out?"),
    ("My train to work leaves at {hour}.",
     "when does my train leave?", "what time is the work train?",
     "when do I have to be on the platform?"),
    ("I keep the tax papers in the {colour} folder.",
     "where are the tax papers?", "which folder has the tax documents?",
     "where is the paperwork for the accountant?"),
    ("My mother's maiden name is {name}.",
     "what is my mother's maiden name?", "what was my mum's surname?",
     "what is the answer to the bank's security question?"),
    ("The garden gate code is {n}.",
     "what is the gate code?", "code for the garden?",
     "how do I open the back entrance?"),
    ("My yoga class is on {day} evenings.",
     "when is my yoga class?", "which evening is yoga?",
     "when do I go stretching?"),
    ("The insurance policy number is {plate}.",
     "what is the insurance policy number?", "policy number?",
     "what reference do I give the insurer?"),
    ("My coffee order is a {coffee}.",
     "what is my coffee order?", "what coffee do I drink?",
     "what should you get me at the café?"),
    ("The smoke alarm battery was changed in {month}.",
     "when was the smoke alarm battery changed?", "smoke alarm battery?",
     "when did we last check the fire detector?"),
]
CHATTER = [
    "Can you summarise the news about the {word} market today?", "Write a short poem about {word} and the sea.",
    "Remind me to buy {food} and bread on the way home.", "What is a good recipe with {food}?",
    "Translate 'good morning, {name}' into Spanish.", "How many kilometres is it from {name}ville to the coast?",
    "The meeting with {name} moved to {day} at {hour}.", "I need a number for the {word} club, any idea?",
    "Tell me a joke about a {word} and a doctor.", "Which street has the best {food} in town?",
    "My colleague's car broke down again on {day}.", "What is the password policy at a typical company?",
    "Is {wine} good with {food}?", "Plan a weekend trip for {month} with a train and a bike.",
]
VALUES = {
    "name": ["Moreau", "Okafor", "Lindqvist", "Tanaka", "Rossi", "Novak", "Haddad", "Silva", "Kowalski", "Byrne"],
    "word": ["copper", "falcon", "maple", "orbit", "saffron", "tundra", "velvet", "willow", "zephyr", "harbour"],
    "food": ["peanuts", "shellfish", "sesame", "kiwi", "gluten", "mustard", "celery", "lupin", "soy", "eggs"],
    "month": ["January", "March", "May", "July", "September", "November"], "day": ["Monday", "Wednesday",
                                                                                  "Thursday", "Saturday"],
    "thing": ["flowerpot", "doormat", "stone frog", "boot scraper"], "drug": ["iron", "vitamin D", "thyroid"],
    "place": ["shed", "garage", "alley"], "blood": ["O negative", "A positive", "B negative", "AB positive"],
    "wine": ["Rioja", "Riesling", "Barolo", "Sancerre"], "colour": ["green", "red", "yellow", "blue"],
    "coffee": ["flat white", "double espresso", "oat latte", "cortado"],
}


def fill(template: str, rng: random.Random, fixed: dict[str, str]) -> str:
    slots = {k: rng.choice(v) for k, v in VALUES.items()}
    slots.update(n=str(rng.randint(1000, 9999)), n2=str(rng.randint(2, 46)),
                 hour=f"{rng.randint(6, 9)}:{rng.choice(['00', '15', '30', '45'])}",
                 date=f"{rng.randint(1, 28)} {rng.choice(VALUES['month'])}", year=str(rng.randint(2027, 2034)),
                 plate=f"{rng.choice('ABCDEFGH')}{rng.choice('KLMNPR')}{rng.randint(10, 99)} "
                       f"{rng.choice('XYZ')}{rng.randint(100, 999)}",
                 phone=f"0{rng.randint(100, 999)} {rng.randint(100000, 999999)}")
    slots.update(fixed)
    return template.format(**slots)


async def plant(bus: Bus, rng: random.Random, people: int, chatter_per_person: int) -> list[tuple[str, str, int, str]]:
    """Say the facts and the chatter; the questions, as (identity, session, kind, question)."""
    store = SessionStore(bus.redis, bus.keys)
    questions = []
    for p in range(people):
        who = f"person{p}"
        fixed = {"name": rng.choice(VALUES["name"])}
        sessions = [f"{who}/chat-{n}" for n in range(len(FACTS) + chatter_per_person)]
        rng.shuffle(sessions)
        for f, (fact, *asks) in enumerate(FACTS):
            session = sessions[f]
            await store.append(session, TranscriptEntry(role="user", content=fill(fact, rng, fixed)),
                               TranscriptEntry(role="assistant", content="Noted."))
            questions += [(who, session, kind, fill(ask, rng, fixed)) for kind, ask in enumerate(asks)]
        for n in range(chatter_per_person):
            await store.append(sessions[len(FACTS) + n],
                               TranscriptEntry(role="user", content=fill(rng.choice(CHATTER), rng, fixed)),
                               TranscriptEntry(role="assistant", content=fill(rng.choice(CHATTER), rng, fixed)))
    return questions


async def bulk(bus: Bus, rng: random.Random, chunks: int) -> None:
    """Other identities' chatter, written straight to the log in big pipelines (as many sessions would)."""
    from memory.recall import said

    written = 0
    while written < chunks:
        async with bus.redis.pipeline(transaction=False) as pipe:
            for _ in range(1000):
                text = " ".join(fill(rng.choice(CHATTER), rng, {}) for _ in range(3))
                entry = said(f"other{written % 500}/s{written % 97}", "user", text, int(time.time() * 1000),
                             str(written))
                assert entry is not None
                pipe.xadd(bus.keys.memory_log, entry)  # type: ignore[arg-type]
                written += 1
            await pipe.execute()


async def timed(recall: Recall, questions: list[tuple[str, str, int, str]]) -> list[float]:
    """Each question's search time, in ms."""
    times = []
    for who, _, _, question in questions:
        started = time.perf_counter()
        await recall.search("main", question, owner=who, limit=5)
        times.append((time.perf_counter() - started) * 1000)
    return times


async def main(args: argparse.Namespace) -> None:
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="pincer-bench-recall-") as tmp:
        redis = EmbeddedRedis(Path(tmp) / "redis")
        url = redis.start()
        bus = Bus.from_settings(RedisSettings(), url)
        try:
            questions = await plant(bus, rng, args.people, args.chatter)
            found: dict[str, dict[int, int]] = {}
            for name, embeddings in (("BM25", False), ("hybrid", True)):
                recall = Recall(bus.redis, bus.keys, embeddings=embeddings)
                found[name] = {0: 0, 1: 0, 2: 0}
                for who, session, kind, question in questions:
                    hits = await recall.search("main", question, owner=who, limit=5)
                    found[name][kind] += any(h.get("session") == session.partition("/")[2] for h in hits)
            small = await recall.size()
            started = time.perf_counter()
            await bulk(bus, rng, args.chunks - small)
            await recall.catch_up()
            indexed = time.perf_counter() - started
            times = await timed(recall, rng.sample(questions, min(200, len(questions))))
            size = await recall.size()
            lexical = Recall(bus.redis, bus.keys, embeddings=False)
            lexical_indexed = time.perf_counter()
            await lexical.catch_up()
            lexical_indexed = time.perf_counter() - lexical_indexed
            lexical_times = await timed(lexical, rng.sample(questions, min(200, len(questions))))
        finally:
            redis.stop()
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.node()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    print(f"{len(questions) // 3} facts, {args.people} identities, {small} chunks when asked")
    asked = len(questions) // 3
    for name, hits in found.items():
        kinds = ", ".join(f"{label} {hits[k] / asked:.0%}" for k, label in
                          enumerate(("key word", "rarer word", "no shared word")))
        print(f"recall@5 {name}: {kinds}; all {sum(hits.values()) / len(questions):.0%}")
    for name, took, ms in (("hybrid", indexed, times), ("BM25", lexical_indexed, lexical_times)):
        print(f"{name}: {size:,} chunks indexed from the log in {took:.1f} s; search p50 {statistics.median(ms):.1f} "
              f"ms, p95 {statistics.quantiles(ms, n=20)[18]:.1f} ms")
    print(f"process max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB (both indexes)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--people", type=int, default=10)
    parser.add_argument("--chatter", type=int, default=60, help="everyday sessions per identity")
    parser.add_argument("--chunks", type=int, default=100_000)
    asyncio.run(main(parser.parse_args()))
