"""The embedded encyclopedia: a generated world of people, places, organisations and books,
its articles, and questions that take 1 to 4 searches to answer.

The real Deep Search resources (wiki-18, NQ, HotpotQA, ...) cannot be downloaded here, so the
environment ships a world generated from a seed: deterministic, any size, and built so that
every fact a question needs sits in exactly one article, the article of its subject, and in no
question. Facts chain: a person was born in a city and works for an organisation; a city is
in a country, whose capital is another city; an organisation was founded in a year by a
person and sits in a city; a book was written by a person. Names are made of syllables: a
surname, a place or an organisation is a unique word a lexical retriever finds by name, while
first names and the words of book titles are shared, so that searches also find look-alikes.

Questions (`Question.hops` searches each; the category names the kind):

| category | example | hops |
|---|---|---|
| 1-hop | In which city was Dorin Kaleth born? | person |
| 2-hop | In which country was Dorin Kaleth born? | person, city |
| comparison | How many years apart were Dorin Kaleth and Mira Solven born? | person, person |
| 3-hop | What is the capital of the country where Dorin Kaleth was born? | person, city, country |
| 4-hop | In which city was the founder of the employer of the author of The Quiet Harbour born? | book, person, organisation, person |

Articles never name what lies one hop further (a person's article gives the city of birth,
not its country), so a multi-hop answer is in none of the articles a search for the
question's own words finds first.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import cache

CATEGORIES = ("1-hop", "2-hop", "comparison", "3-hop", "4-hop")

_SYLLABLES = ("ka", "lo", "ven", "mir", "dor", "sa", "tel", "ru", "bra", "nis", "qua", "fen", "li", "gor", "the",
              "mon", "va", "zel", "pri", "os", "tan", "ber", "cu", "shi", "dra", "el", "wyn", "har", "ste", "no",
              "pax", "ri", "lun", "cor", "ada", "fi", "mer", "ty", "gal", "ion")
_OCCUPATIONS = ("architect", "chemist", "painter", "engineer", "historian", "composer", "surgeon", "poet",
                "astronomer", "economist", "sculptor", "botanist", "geologist", "novelist", "physicist",
                "cartographer", "linguist", "photographer", "diplomat", "mathematician")
_ORG_KINDS = ("Institute", "Company", "Works", "Guild", "University", "Foundation", "Press", "Observatory",
              "Laboratories", "Trading House")
_ADJECTIVES = ("Quiet", "Silver", "Hidden", "Broken", "Distant", "Golden", "Last", "Crimson", "Winter", "Endless",
               "Forgotten", "Northern", "Glass", "Burning", "Silent", "Wandering")
_NOUNS = ("Harbour", "Orchard", "Lantern", "River", "Garden", "Tower", "Meadow", "Bridge", "Archive", "Voyage",
          "Citadel", "Forest", "Mirror", "Compass", "Island", "Season")


@dataclass
class Person:
    name: str
    born: int
    birthplace: str
    employer: str
    occupation: str


@dataclass
class City:
    name: str
    country: str
    founded: int


@dataclass
class Country:
    name: str
    capital: str


@dataclass
class Organisation:
    name: str
    founded: int
    founder: str
    headquarters: str


@dataclass
class Book:
    title: str
    author: str
    published: int


@dataclass(frozen=True)
class Article:
    """One document: `id`, `title` and `text` (the corpus row is {"id", "contents": "title\\ntext"})."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Question:
    """A question, its answer, and the chain of searches that finds it.

    Attributes:
        hops: (subject, relation) per search, in order: search the subject's name, read the
            relation in its article; the value read is the next hop's subject. A comparison
            has two independent hops (both "born") and its answer is their difference.
    """

    question: str
    answer: str
    category: str
    hops: tuple[tuple[str, str], ...]
    answers: tuple[str, ...] = ()
    """Every accepted answer when there are several (real QA data); else just `answer`."""


@dataclass(eq=False)  # hashed by identity: the retriever of a world is cached
class World:
    people: dict[str, Person] = field(default_factory=dict)
    cities: dict[str, City] = field(default_factory=dict)
    countries: dict[str, Country] = field(default_factory=dict)
    organisations: dict[str, Organisation] = field(default_factory=dict)
    books: dict[str, Book] = field(default_factory=dict)
    articles: list[Article] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)

    def fact(self, subject: str, relation: str) -> str:
        """The value of `relation` for the entity named `subject` (what its article states)."""
        for table in (self.people, self.cities, self.countries, self.organisations, self.books):
            if subject in table:
                return str(getattr(table[subject], relation))
        raise KeyError(subject)


class _Names:
    """Unique names from syllables."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def word(self, low: int = 2, high: int = 3, suffix: str = "") -> str:
        for _ in range(10_000):
            word = "".join(self.rng.choice(_SYLLABLES) for _ in range(self.rng.randint(low, high)))
            word = (word + suffix).capitalize()
            if word not in self.used:
                self.used.add(word)
                return word
        raise ValueError(f"ran out of {low}-{high}-syllable names after {len(self.used)}: ask for a smaller world")


def build_world(size: int = 1000, seed: int = 0, questions: int = 3000) -> World:
    """The world with `size` people (and size/4 organisations, size/2 books, size/6 cities,
    size/25 countries, at least a few of each), its articles and `questions` questions, the
    same for the same arguments."""
    if size < 50:
        raise ValueError(f"the world needs at least 50 people, got size={size}")
    rng = random.Random(f"search-world-{seed}")
    names, world = _Names(rng), World()
    country_names = [names.word(2, 3, suffix) for suffix in rng.choices(("ia", "land", "mark", "stan"),
                                                                        k=max(8, size // 25))]
    city_names = [names.word(2, 3, rng.choice(("", "ford", "holm", "burg", "port"))) for _ in range(max(30, size // 6))]
    for index, city in enumerate(city_names):  # every country gets cities; its first is the capital
        world.cities[city] = City(city, country_names[index % len(country_names)], rng.randint(800, 1900))
    for country in country_names:
        capital = next(c.name for c in world.cities.values() if c.country == country)
        world.countries[country] = Country(country, capital)
    # First names are shared (a search for one finds several people: distractors); surnames
    # are unique, so a full name finds its own article first.
    longest = 3 if size <= 5000 else 4  # syllables: short names, unless a large world needs more of them
    first_names = [names.word(2, 3) for _ in range(max(10, size // 5))]
    person_names = [f"{rng.choice(first_names)} {names.word(2, longest)}" for _ in range(size)]
    org_names = [f"{names.word(2, 3)} {rng.choice(_ORG_KINDS)}" for _ in range(max(12, size // 4))]
    for person in person_names:
        world.people[person] = Person(person, rng.randint(1850, 1990), rng.choice(city_names), rng.choice(org_names),
                                      rng.choice(_OCCUPATIONS))
    for org in org_names:
        world.organisations[org] = Organisation(org, rng.randint(1800, 2000), rng.choice(person_names),
                                                rng.choice(city_names))
    titles: set[str] = set()
    while len(titles) < max(25, size // 2):
        titles.add(f"The {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} of {names.word(2, longest)}")
    for title in sorted(titles):
        world.books[title] = Book(title, rng.choice(person_names), rng.randint(1870, 2020))
    world.articles = _articles(world, rng)
    capitals = {country.capital for country in world.countries.values()}
    # No answer may be in the first article read: nobody born in a capital is asked its
    # country's capital, nobody is asked who founded their own employer.
    askable = [name for name, p in sorted(world.people.items()) if p.birthplace not in capitals
               and world.organisations[p.employer].founder != name]
    people, books = sorted(world.people), sorted(world.books)
    world.questions = [_question(world, people, askable, books, random.Random(f"search-question-{seed}-{i}"),
                                 CATEGORIES[i % len(CATEGORIES)]) for i in range(questions)]
    return world


def _articles(world: World, rng: random.Random) -> list[Article]:
    """One article per entity, in a shuffled order (ids say nothing about the kind)."""
    texts = []
    for p in world.people.values():
        article = "an" if p.occupation[0] in "aeiou" else "a"
        texts.append((p.name, f"{p.name} (born {p.born}) is {article} {p.occupation}. {p.name} was born in {p.birthplace}. "
                              f"{p.name} works for {p.employer}."))
    for c in world.cities.values():
        texts.append((c.name, f"{c.name} is a city in {c.country}. It was founded in {c.founded}."))
    for c in world.countries.values():
        texts.append((c.name, f"{c.name} is a country. Its capital is {c.capital}."))
    for o in world.organisations.values():
        texts.append((o.name, f"{o.name} was founded in {o.founded} by {o.founder}. "
                              f"{o.name} is headquartered in {o.headquarters}."))
    for b in world.books.values():
        texts.append((b.title, f"{b.title} is a book written by {b.author}. It was published in {b.published}."))
    rng.shuffle(texts)
    return [Article(str(i), title, text) for i, (title, text) in enumerate(texts)]


def _question(world: World, people: list[str], askable: list[str], books: list[str], rng: random.Random,
              category: str) -> Question:
    person, book = rng.choice(askable), rng.choice(books)
    p = world.people[person]
    if category == "1-hop":
        kind = rng.randrange(4)
        if kind == 0:
            return Question(f"In which city was {person} born?", p.birthplace, category, ((person, "birthplace"),))
        if kind == 1:
            return Question(f"Who wrote {book}?", world.books[book].author, category, ((book, "author"),))
        if kind == 2:
            return Question(f"Which organisation does {person} work for?", p.employer, category,
                            ((person, "employer"),))
        org = p.employer
        return Question(f"Who founded {org}?", world.organisations[org].founder, category, ((org, "founder"),))
    if category == "2-hop":
        kind = rng.randrange(3)
        if kind == 0:
            return Question(f"In which country was {person} born?", world.cities[p.birthplace].country, category,
                            ((person, "birthplace"), (p.birthplace, "country")))
        if kind == 1:
            author = world.books[book].author
            return Question(f"In which city was the author of {book} born?", world.people[author].birthplace,
                            category, ((book, "author"), (author, "birthplace")))
        return Question(f"Who founded the organisation that {person} works for?",
                        world.organisations[p.employer].founder, category,
                        ((person, "employer"), (p.employer, "founder")))
    if category == "comparison":
        other = rng.choice([q for q in people if world.people[q].born != p.born])
        return Question(f"How many years apart were {person} and {other} born?",
                        str(abs(p.born - world.people[other].born)), category, ((person, "born"), (other, "born")))
    if category == "3-hop":
        if rng.randrange(2) == 0:
            country = world.cities[p.birthplace].country
            return Question(f"What is the capital of the country where {person} was born?",
                            world.countries[country].capital, category,
                            ((person, "birthplace"), (p.birthplace, "country"), (country, "capital")))
        author = world.books[book].author
        city = world.people[author].birthplace
        return Question(f"In which country was the author of {book} born?", world.cities[city].country, category,
                        ((book, "author"), (author, "birthplace"), (city, "country")))
    author = world.books[book].author
    employer = world.people[author].employer
    founder = world.organisations[employer].founder
    return Question(f"In which city was the founder of the employer of the author of {book} born?",
                    world.people[founder].birthplace, category,
                    ((book, "author"), (author, "employer"), (employer, "founder"), (founder, "birthplace")))


@cache
def cached_world(size: int = 1000, seed: int = 0) -> World:
    """`build_world(size, seed)`, built once per process (the `search` env's default is 1000, 0)."""
    return build_world(size, seed)
