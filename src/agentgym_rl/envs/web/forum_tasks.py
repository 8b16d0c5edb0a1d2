"""The embedded forum's tasks (`task_plans.py` for their layout): questions about posts and
users, navigation to boards, posts and profiles, and state changes (votes, comments, new
posts) checked on the episode's database with `site_state` queries."""

from __future__ import annotations

import random
import sqlite3
from typing import Iterator

from .forum_data import BOARDS, ME
from .task_plans import Instance, Template, assemble, click, stop, type_into

SITE = "reddit"  # WebArena's name for its forum site (placeholder __REDDIT__)
HOME = "__REDDIT__"
NEW_TITLES = ["Weekly thread: {x}", "Beginner question about {x}", "Show and tell: {x}"]
REPLIES = ["Thanks, this helped me a lot.", "I would try a different approach.", "Great photos, well done!",
           "Where did you buy it?", "Same experience here.", "Could you post an update next week?",
           "I never thought of that.", "Welcome to the forum!"]


def _posts(db: sqlite3.Connection) -> list[tuple]:
    return db.execute("SELECT p.id, p.board, p.title, p.author, p.score, COUNT(c.id) FROM posts p "
                      "LEFT JOIN comments c ON c.post_id = p.id GROUP BY p.id ORDER BY p.id").fetchall()


def _search(title: str) -> dict:
    return type_into("searchbox", "Search posts", title, enter=True)


def _author(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for _, _, title, author, _, _ in rng.sample(_posts(db), 40):
        yield ({"title": title}, {"eval_types": ["string_match"], "reference_answers": {"exact_match": author}},
               [_search(title), stop(author)])


def _comment_count(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for _, _, title, _, _, comments in rng.sample(_posts(db), 40):
        yield ({"title": title}, {"eval_types": ["string_match"], "reference_answers": {"exact_match": str(comments)}},
               [_search(title), stop(str(comments))])


def _score(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for _, _, title, _, score, _ in rng.sample(_posts(db), 40):
        yield ({"title": title}, {"eval_types": ["string_match"], "reference_answers": {"exact_match": str(score)}},
               [_search(title), click(title), stop(str(score))])


def _top_post(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for board in rng.sample(sorted(BOARDS), len(BOARDS)):
        rows = db.execute("SELECT title, score FROM posts WHERE board = ? ORDER BY score DESC, id", (board,)).fetchall()
        if rows[0][1] == rows[1][1]:
            continue  # no single top post
        yield ({"board": board}, {"eval_types": ["string_match"], "reference_answers": {"must_include": [rows[0][0]]}},
               [click(f"f/{board}"), click("Sort by top"), stop(rows[0][0])])


def _joined(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for _, _, title, author, _, _ in rng.sample(_posts(db), 40):
        joined = db.execute("SELECT joined FROM users WHERE name = ?", (author,)).fetchone()[0]
        yield ({"title": title}, {"eval_types": ["string_match"], "reference_answers": {"must_include": [joined]}},
               [_search(title), click(author), stop(joined)])


def _open_post(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for pid, board, title, *_ in rng.sample(_posts(db), 40):
        yield ({"title": title}, {"eval_types": ["url_match"], "reference_url": f"{HOME}/f/{board}/{pid}"},
               [_search(title), click(title), stop()])


def _sorted_board(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    pairs = [(board, key) for board in sorted(BOARDS) for key in ("new", "top", "title")]
    for board, key in rng.sample(pairs, len(pairs)):
        yield ({"board": board, "key": key}, {"eval_types": ["url_match"], "reference_url": f"{HOME}/f/{board}?sort={key}"},
               [click(f"f/{board}"), click(f"Sort by {key}"), stop()])


def _profile(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for _, _, title, author, _, _ in rng.sample(_posts(db), 40):
        yield ({"title": title}, {"eval_types": ["url_match"], "reference_url": f"{HOME}/user/{author}"},
               [_search(title), click(author), stop()])


def _vote(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for pid, _, title, _, score, _ in rng.sample(_posts(db), 40):
        direction = rng.choice([1, -1])
        label = "Upvote" if direction == 1 else "Downvote"
        checks = [{"site": SITE, "sql": "SELECT post_id, direction FROM votes", "expected": [[pid, direction]]},
                  {"site": SITE, "sql": f"SELECT score FROM posts WHERE id = {pid}", "expected": [[score + direction]]}]
        yield ({"vote": label, "title": title}, {"eval_types": ["site_state"], "site_state": checks},
               [_search(title), click(title), click(label, "button"), stop()])


def _reply(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for pid, _, title, *_ in rng.sample(_posts(db), 40):
        text = rng.choice(REPLIES)
        check = {"site": SITE, "sql": f"SELECT post_id, body FROM comments WHERE author = '{ME}'", "expected": [[pid, text]]}
        yield ({"title": title, "text": text}, {"eval_types": ["site_state"], "site_state": [check]},
               [_search(title), click(title), type_into("textbox", "Comment", text), click("Post comment", "button"), stop()])


def _new_post(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    choices = [(board, template.format(x=subject)) for board, (_, _, subjects) in BOARDS.items()
               for template in NEW_TITLES for subject in subjects]
    for board, title in rng.sample(choices, 40):
        text = rng.choice(REPLIES)
        check = {"site": SITE, "sql": f"SELECT board, title, body FROM posts WHERE author = '{ME}'",
                 "expected": [[board, title, text]]}
        yield ({"board": board, "title": title, "text": text}, {"eval_types": ["site_state"], "site_state": [check]},
               [click(f"f/{board}"), click("Submit a new post"), type_into("textbox", "Title", title),
                type_into("textbox", "Text", text), click("Create post", "button"), stop()])


TEMPLATES: list[Template] = [
    ("info", "Who posted '{title}'?", _author),
    ("info", "How many comments does the post '{title}' have?", _comment_count),
    ("info", "What is the score of the post '{title}'?", _score),
    ("info", "What is the title of the highest-scored post in f/{board}?", _top_post),
    ("info", "When did the author of '{title}' join the forum?", _joined),
    ("navigation", "Open the post '{title}'.", _open_post),
    ("navigation", "Show f/{board} sorted by {key}.", _sorted_board),
    ("navigation", "Open the profile page of the author of '{title}'.", _profile),
    ("state", "{vote} the post '{title}'.", _vote),
    ("state", "Reply to the post '{title}' with the comment: {text}", _reply),
    ("state", "Create a post in f/{board} titled '{title}' with the text: {text}", _new_post),
]


def forum_tasks(db: sqlite3.Connection, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(test, train) task configs over the forum database `db` (the pristine one)."""
    return assemble(SITE, HOME, TEMPLATES, db, seed)
