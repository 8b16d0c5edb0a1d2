"""The forum's generated data: boards, users, posts with scores, comments, and the signed-in
user's votes, written into a SQLite database (one seed, one forum)."""

from __future__ import annotations

import random
import sqlite3

SCHEMA = """
CREATE TABLE boards (name TEXT PRIMARY KEY, description TEXT NOT NULL);
CREATE TABLE users (name TEXT PRIMARY KEY, joined TEXT NOT NULL);
CREATE TABLE posts (id INTEGER PRIMARY KEY, board TEXT NOT NULL REFERENCES boards(name),
    author TEXT NOT NULL REFERENCES users(name), title TEXT UNIQUE NOT NULL, body TEXT NOT NULL,
    score INTEGER NOT NULL, posted TEXT NOT NULL);
CREATE TABLE comments (id INTEGER PRIMARY KEY, post_id INTEGER NOT NULL REFERENCES posts(id),
    author TEXT NOT NULL REFERENCES users(name), body TEXT NOT NULL);
CREATE TABLE votes (post_id INTEGER PRIMARY KEY REFERENCES posts(id), direction INTEGER NOT NULL);
"""

ME = "quietowl"
"""The signed-in user: posts, comments and votes are hers."""

BOARDS = {
    "books": ("novels", ["Finished {x} last night", "Is {x} worth reading?", "Looking for books like {x}"],
              ["The Salt Road", "Paper Moons", "The Long Winter", "Ninth Harbour", "A Quiet Orchard", "Glass Rivers"]),
    "cooking": ("recipes", ["My first attempt at {x}", "How do you store {x}?", "Best pan for {x}?"],
                ["sourdough", "ramen broth", "lemon tart", "dumplings", "risotto", "flatbread"]),
    "gardening": ("plants", ["Yellow leaves on my {x}", "When to prune {x}?", "Finally, {x} in bloom"],
                  ["tomatoes", "roses", "basil", "lavender", "fig tree", "peonies"]),
    "cycling": ("bikes", ["Commuting with a {x}", "Upgrading the {x} on my bike", "Which {x} for winter?"],
                ["gravel bike", "chain", "saddle", "rear light", "tyres", "pannier"]),
    "photography": ("cameras", ["Tips for shooting {x}", "Edited my {x} photos", "Lens advice for {x}"],
                    ["night skies", "street scenes", "birds", "portraits", "waterfalls", "macro insects"]),
    "music": ("instruments", ["Learning {x} at forty", "Practice routine for {x}", "Cheap {x} worth buying?"],
              ["the cello", "jazz piano", "the ukulele", "drums", "the banjo", "violin"]),
    "travel": ("trips", ["Two weeks in {x}: report", "Budget tips for {x}", "Rainy season in {x}?"],
               ["Lisbon", "Hokkaido", "Patagonia", "the Alps", "Morocco", "Iceland"]),
    "science": ("discoveries", ["Explain {x} like I'm five", "New paper on {x}", "Why does {x} matter?"],
                ["dark matter", "CRISPR", "plate tectonics", "quantum dots", "exoplanets", "enzymes"]),
}
USER_PARTS = (["amber", "brisk", "cosmic", "dusty", "early", "fuzzy", "gentle", "hidden", "lucky", "misty", "noble", "rapid"],
              ["fox", "heron", "otter", "maple", "comet", "pebble", "lynx", "willow", "falcon", "badger"])
BODIES = ["I have been thinking about this for a while and would love your opinions.",
          "Sharing what worked for me, in case it helps someone.",
          "Any advice is welcome, I am new to this.",
          "Long story short: it went better than expected.",
          "Curious how others approach this."]
COMMENTS = ["Great post, thanks!", "I had the same problem last year.", "Have you tried asking at a local shop?",
            "This is really helpful.", "I disagree, but interesting read.", "Following for updates.",
            "Same here!", "Could you share more details?"]


def build_forum(seed: int = 0) -> sqlite3.Connection:
    """A new in-memory database holding the whole forum for `seed` (about 140 posts)."""
    rng = random.Random(seed)
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.executescript(SCHEMA)
    db.executemany("INSERT INTO boards VALUES (?, ?)",
                   [(name, f"A place to talk about {topic}.") for name, (topic, _, _) in BOARDS.items()])
    names = sorted({f"{rng.choice(USER_PARTS[0])}_{rng.choice(USER_PARTS[1])}{rng.randrange(10, 99)}" for _ in range(30)})
    users = [ME, *names]
    db.executemany("INSERT INTO users VALUES (?, ?)",
                   [(name, f"20{rng.randrange(18, 26)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}") for name in users])
    posts = []
    for board, (_, templates, subjects) in BOARDS.items():
        for template in templates:
            for subject in rng.sample(subjects, 6):
                posts.append([len(posts) + 1, board, rng.choice(names), template.format(x=subject), rng.choice(BODIES),
                              rng.randrange(-5, 300), f"2026-{rng.randrange(1, 12):02d}-{rng.randrange(1, 29):02d}"])
    db.executemany("INSERT INTO posts VALUES (?, ?, ?, ?, ?, ?, ?)", posts)
    comments = []
    for post in posts:
        for _ in range(rng.randrange(0, 7)):
            comments.append((len(comments) + 1, post[0], rng.choice(names), rng.choice(COMMENTS)))
    db.executemany("INSERT INTO comments VALUES (?, ?, ?, ?)", comments)
    db.commit()
    return db
