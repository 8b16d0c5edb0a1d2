"""The online shop's generated data: a catalogue, reviews, one customer and her past orders,
written into a SQLite database.

Everything comes from one seed, so the same seed always gives the same shop, and the web
tasks (`shop_tasks.py`) can name its products, prices and orders.
"""

from __future__ import annotations

import random
import sqlite3

SCHEMA = """
CREATE TABLE categories (slug TEXT PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE products (
    id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, category TEXT NOT NULL REFERENCES categories(slug),
    price_cents INTEGER NOT NULL, stock INTEGER NOT NULL, description TEXT NOT NULL);
CREATE TABLE reviews (
    id INTEGER PRIMARY KEY, product_id INTEGER NOT NULL REFERENCES products(id), author TEXT NOT NULL,
    stars INTEGER NOT NULL, title TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL,
    street TEXT NOT NULL, city TEXT NOT NULL, zip TEXT NOT NULL);
CREATE TABLE cart_items (product_id INTEGER PRIMARY KEY REFERENCES products(id), quantity INTEGER NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, placed TEXT NOT NULL, status TEXT NOT NULL,
    street TEXT NOT NULL, city TEXT NOT NULL, zip TEXT NOT NULL);
CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(id),
    product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL,
    price_cents INTEGER NOT NULL);
"""

CATEGORIES = {
    "kitchen": ("Kitchen", ["Kettle", "Frying Pan", "Chef Knife", "Cutting Board", "Teapot", "Mixing Bowl", "Toaster", "Colander"]),
    "electronics": ("Electronics", ["Headphones", "Speaker", "Charger", "Keyboard", "Webcam", "Monitor Stand", "Power Bank", "Desk Lamp"]),
    "garden": ("Garden", ["Watering Can", "Garden Hose", "Pruning Shears", "Planter", "Rake", "Bird Feeder", "Trowel", "Wheelbarrow"]),
    "sports": ("Sports", ["Yoga Mat", "Water Bottle", "Dumbbell", "Jump Rope", "Tennis Racket", "Backpack", "Bike Helmet", "Running Cap"]),
    "office": ("Office", ["Notebook", "Stapler", "Desk Organizer", "Fountain Pen", "Paper Tray", "Whiteboard", "Calculator", "Bookend"]),
    "toys": ("Toys", ["Puzzle", "Kite", "Building Blocks", "Teddy Bear", "Toy Train", "Yo-Yo", "Board Game", "Spinning Top"]),
}
BRANDS = ["Alder", "Brisk", "Cobalt", "Dune", "Ember", "Fjord", "Granite", "Harbor", "Indigo", "Juniper"]
STYLES = ["Classic", "Compact", "Deluxe", "Eco", "Pro", "Travel"]
COLOURS = ["Red", "Blue", "Green", "Black", "White", "Grey", "Yellow", "Orange"]
FIRST_NAMES = ["Ava", "Ben", "Chloe", "Diego", "Elif", "Farah", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena",
               "Mateo", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tara"]
LAST_NAMES = ["Adams", "Baker", "Chen", "Diaz", "Evans", "Fischer", "Garcia", "Hughes", "Ito", "Jensen"]
CITIES = ["Portsmouth", "Lakeside", "Riverton", "Hillcrest", "Maplewood", "Brookfield", "Fairview", "Oakridge"]
STREETS = ["Elm Street", "Oak Avenue", "Pine Road", "Cedar Lane", "Birch Way", "Willow Drive", "Harbour Row"]
REVIEW_TITLES = {
    5: ["Excellent", "Love it", "Worth every penny", "Perfect"],
    4: ["Very good", "Solid choice", "Happy with it"],
    3: ["It is fine", "Average", "Does the job"],
    2: ["Disappointing", "Not great", "Expected more"],
    1: ["Broke quickly", "Avoid", "Waste of money"],
}
REVIEW_BODIES = {
    5: "Works exactly as described and feels well made.",
    4: "Good quality for the price, with small flaws.",
    3: "Neither good nor bad; it does what it says.",
    2: "The finish is poor and it feels cheap.",
    1: "It stopped working after a few days.",
}
STATUSES = ["delivered", "shipped", "pending", "cancelled"]
CUSTOMER = ("Emma Lopez", "emma.lopez@example.com")


def build_shop(seed: int = 0) -> sqlite3.Connection:
    """A new in-memory database holding the whole shop for `seed` (about 300 products)."""
    rng = random.Random(seed)
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.executescript(SCHEMA)
    db.executemany("INSERT INTO categories VALUES (?, ?)", [(slug, name) for slug, (name, _) in CATEGORIES.items()])
    names: set[str] = set()
    products = []
    for slug, (_, items) in CATEGORIES.items():
        for item in items:
            for brand in rng.sample(BRANDS, 6):
                name = f"{brand} {rng.choice(STYLES)} {rng.choice(COLOURS)} {item}"
                if name in names:
                    continue
                names.add(name)
                price = rng.randrange(3, 250) * 100 + rng.choice([0, 49, 95, 99])
                description = f"A {name.split()[1].lower()} {item.lower()} by {brand}, in {name.split()[2].lower()}."
                products.append((len(products) + 1, name, slug, price, rng.randrange(0, 60), description))
    db.executemany("INSERT INTO products VALUES (?, ?, ?, ?, ?, ?)", products)
    reviews = []
    for product_id, *_ in products:
        for _ in range(rng.randrange(0, 6)):
            stars = rng.choice([5, 5, 4, 4, 4, 3, 2, 1])
            author = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
            reviews.append((len(reviews) + 1, product_id, author, stars, rng.choice(REVIEW_TITLES[stars]),
                            REVIEW_BODIES[stars]))
    db.executemany("INSERT INTO reviews VALUES (?, ?, ?, ?, ?, ?)", reviews)
    db.execute("INSERT INTO customer VALUES (1, ?, ?, ?, ?, ?)",
               (*CUSTOMER, f"{rng.randrange(1, 200)} {rng.choice(STREETS)}", rng.choice(CITIES), f"{rng.randrange(10000, 99999)}"))
    street, city, zip_code = db.execute("SELECT street, city, zip FROM customer").fetchone()
    for order_id in range(1, 16):
        db.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?)",
                   (order_id, f"2026-{1 + order_id % 12:02d}-{1 + rng.randrange(28):02d}", rng.choice(STATUSES),
                    street, city, zip_code))
        for product in rng.sample(products, rng.randrange(1, 4)):
            db.execute("INSERT INTO order_items VALUES (?, ?, ?, ?)", (order_id, product[0], rng.randrange(1, 4), product[3]))
    db.commit()
    return db


def money(cents: int) -> str:
    """1299 -> "$12.99"."""
    return f"${cents // 100}.{cents % 100:02d}"
