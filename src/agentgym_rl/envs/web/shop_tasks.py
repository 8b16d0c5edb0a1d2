"""The embedded shop's tasks (`task_plans.py` for their layout): questions about products and
orders, navigation to pages, and state changes (cart, orders, address, admin prices) checked
on the episode's database with `site_state` queries."""

from __future__ import annotations

import random
import sqlite3
from typing import Iterator

from .shop_data import CATEGORIES, money
from .task_plans import Instance, Template, assemble, click, stop, type_into

SITE = "shopping"
HOME = "__SHOPPING__"
NEW_ADDRESSES = [("12 Quarry Lane", "Westport", "20451"), ("7 Orchard Close", "Dunmore", "31877"),
                 ("88 Station Road", "Kelby", "40012"), ("3 Mill Street", "Ashby", "55120"),
                 ("41 Harbour View", "Carrow", "61234"), ("19 Bell Court", "Everton", "70333"),
                 ("5 Canal Walk", "Fenwick", "80888"), ("230 Ridge Road", "Glenholm", "90102")]


def _search(name: str) -> list[dict]:
    return [type_into("searchbox", "Search products", name, enter=True), click(name)]


def _products(db: sqlite3.Connection) -> list[tuple]:
    return db.execute("SELECT id, name, category, price_cents, stock FROM products ORDER BY id").fetchall()


def _price(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for pid, name, _, price, _ in rng.sample(_products(db), 40):
        yield ({"product": name}, {"eval_types": ["string_match"], "reference_answers": {"must_include": [money(price)]}},
               [*_search(name), stop(money(price))])


def _review_count(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for pid, name, *_ in rng.sample(_products(db), 40):
        count = db.execute("SELECT COUNT(*) FROM reviews WHERE product_id = ?", (pid,)).fetchone()[0]
        yield ({"product": name}, {"eval_types": ["string_match"], "reference_answers": {"exact_match": str(count)}},
               [*_search(name), stop(str(count))])


def _stock(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for pid, name, _, _, stock in rng.sample(_products(db), 40):
        yield ({"product": name}, {"eval_types": ["string_match"], "reference_answers": {"exact_match": str(stock)}},
               [*_search(name), stop(str(stock))])


def _cheapest_of_kind(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    kinds = [item for _, items in CATEGORIES.values() for item in items]
    for kind in rng.sample(kinds, len(kinds)):
        rows = sorted((price, name) for _, name, _, price, _ in _products(db) if kind.lower() in name.lower())
        if len(rows) < 2 or rows[0][0] == rows[1][0]:
            continue  # no single cheapest one
        yield ({"kind": kind}, {"eval_types": ["string_match"], "reference_answers": {"must_include": [rows[0][1]]}},
               [type_into("searchbox", "Search products", kind, enter=True), stop(rows[0][1])])


def _order_total(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    totals = db.execute("SELECT order_id, SUM(price_cents * quantity) FROM order_items GROUP BY order_id").fetchall()
    for order_id, total in rng.sample(totals, len(totals)):
        yield ({"order": order_id}, {"eval_types": ["string_match"], "reference_answers": {"must_include": [money(total)]}},
               [click("My orders"), click(f"Order #{order_id}"), stop(money(total))])


def _open_product(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for pid, name, *_ in rng.sample(_products(db), 40):
        yield ({"product": name}, {"eval_types": ["url_match"], "reference_url": f"{HOME}/product/{pid}"},
               [*_search(name), stop()])


def _sorted_category(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    pairs = [(slug, name, key) for slug, (name, _) in CATEGORIES.items() for key in ("name", "price", "rating")]
    for slug, name, key in rng.sample(pairs, len(pairs)):
        yield ({"category": name, "key": key},
               {"eval_types": ["url_match"], "reference_url": f"{HOME}/category/{slug}?sort={key}"},
               [click(name), click(f"Sort by {key}"), stop()])


def _add_to_cart(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for pid, name, *_ in rng.sample([row for row in _products(db) if row[4] > 0], 40):
        quantity = rng.randrange(2, 5)
        check = {"site": SITE, "sql": "SELECT product_id, quantity FROM cart_items", "expected": [[pid, quantity]]}
        yield ({"quantity": quantity, "product": name}, {"eval_types": ["site_state"], "site_state": [check]},
               [*_search(name), type_into("spinbutton", "Quantity", str(quantity)),
                click("Add to cart", "button"), stop()])


def _buy(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    next_order = db.execute("SELECT MAX(id) + 1 FROM orders").fetchone()[0]
    for pid, name, *_ in rng.sample([row for row in _products(db) if row[4] > 0], 40):
        checks = [{"site": SITE, "sql": f"SELECT product_id, quantity FROM order_items WHERE order_id = {next_order}",
                   "expected": [[pid, 1]]},
                  {"site": SITE, "sql": "SELECT COUNT(*) FROM orders", "expected": [[next_order]]}]
        yield ({"product": name}, {"eval_types": ["site_state"], "site_state": checks},
               [*_search(name), click("Add to cart", "button"), click("Proceed to checkout"),
                click("Place order", "button"), stop()])


def _change_address(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for street, city, zip_code in rng.sample(NEW_ADDRESSES * 3, len(NEW_ADDRESSES) * 3):
        number = rng.randrange(1, 99)
        street = f"{number} {street.split(' ', 1)[1]}"
        check = {"site": SITE, "sql": "SELECT street, city, zip FROM customer", "expected": [[street, city, zip_code]]}
        steps = [click("My account")]
        for label, value in (("Street", street), ("City", city), ("ZIP code", zip_code)):
            steps.append(type_into("textbox", label, value))
        yield ({"street": street, "city": city, "zip": zip_code}, {"eval_types": ["site_state"], "site_state": [check]},
               [*steps, click("Save address", "button"), stop()])


def _admin_price(db: sqlite3.Connection, rng: random.Random) -> Iterator[Instance]:
    for pid, name, _, price, _ in rng.sample(_products(db), 40):
        new_price = price + rng.choice([-1, 1]) * rng.randrange(1, 10) * 100 if price > 1000 else price + 500
        check = {"site": SITE, "sql": f"SELECT price_cents FROM products WHERE id = {pid}", "expected": [[new_price]]}
        yield ({"product": name, "price": money(new_price)}, {"eval_types": ["site_state"], "site_state": [check]},
               [click("Admin"), type_into("searchbox", "Filter products by name", name, enter=True),
                click(f"Edit {name}"),
                type_into("textbox", "Price", f"{new_price / 100:.2f}"),
                click("Save product", "button"), stop()])


TEMPLATES: list[Template] = [
    ("info", "What is the price of the {product}?", _price),
    ("info", "How many reviews does the {product} have?", _review_count),
    ("info", "How many units of the {product} are in stock?", _stock),
    ("info", "Which {kind} is the cheapest in the shop? Give its full name.", _cheapest_of_kind),
    ("info", "What was the total of my order #{order}?", _order_total),
    ("navigation", "Open the product page of the {product}.", _open_product),
    ("navigation", "Show the {category} category sorted by {key}.", _sorted_category),
    ("state", "Add {quantity} of the {product} to my cart.", _add_to_cart),
    ("state", "Buy one {product} (add it to the cart, check out and place the order).", _buy),
    ("state", "Change my shipping address to {street}, {city}, ZIP code {zip}.", _change_address),
    ("state", "In the admin panel, set the price of the {product} to {price}.", _admin_price),
]


def shop_tasks(db: sqlite3.Connection, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(test, train) task configs over the shop database `db` (the pristine one)."""
    return assemble(SITE, HOME, TEMPLATES, db, seed)
