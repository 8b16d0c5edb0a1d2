"""The web environment's parts that need no browser: WebArena's action grammar, the
accessibility-tree text, the evaluators (hand-computed), and the shop site with its database
per tenant and its reset."""

from __future__ import annotations

import socket

import pytest
from starlette.testclient import TestClient

from agentgym_rl.envs.web.actions import Action, ParseError, parse_action
from agentgym_rl.envs.web.axtree import render_axtree
from agentgym_rl.envs.web.evaluators import clean_answer, contents_match, evaluate, string_match, url_match
from agentgym_rl.envs.web.shop_data import build_shop, money
from agentgym_rl.envs.web.shop_site import shop_app
from agentgym_rl.envs.web import forum_tasks, shop_tasks
from agentgym_rl.envs.web.forum_data import ME, build_forum
from agentgym_rl.envs.web.forum_site import forum_app
from agentgym_rl.envs.web.task_plans import TEST_PER_TEMPLATE
from agentgym_rl.envs.web.site_server import TENANT_HEADER, SiteServer, TenantDatabases


@pytest.mark.parametrize("reply, action", [
    ("I will search.\n```type [14] [blue kettle] [1]```", Action("type", element=14, text="blue kettle")),
    ("```type [3] [x [y] z] [0]```", Action("type", element=3, text="x [y] z", press_enter=False)),
    ("```type [3] [hello]```", Action("type", element=3, text="hello")),  # Enter by default, as in WebArena
    ("```click [1]``` no, ```click [2]```", Action("click", element=2)),  # the last block counts
    ("Action: hover [7]", Action("hover", element=7)),  # no backticks: the last line
    ("```scroll [direction=down]```", Action("scroll", direction="down")),
    ("```stop [$12.99]```", Action("stop", text="$12.99")),
    ("```stop```", Action("stop", text="")),
    ("```goto [http://a/b?c=[1]]```", Action("goto", text="http://a/b?c=[1]")),
    ("```tab_focus [1]```", Action("tab_focus", tab=1)),
    ("```go_back```", Action("go_back")),
    ("```press [Control+a]```", Action("press", text="Control+a")),
])
def test_actions_parse_in_webarenas_grammar(reply, action):
    assert parse_action(reply) == action


@pytest.mark.parametrize("reply, says", [
    ("", "held no action"), ("```click [x]```", "is not an action"), ("```scroll [left]```", "[up] or [down]"),
    ("```tab_focus [one]```", "tab index"), ("```goto```", "needs an argument"), ("dance", "is not an action"),
])
def test_bad_actions_are_explained_not_raised(reply, says):
    parsed = parse_action(reply)
    assert isinstance(parsed, ParseError) and says in parsed.message


def test_actions_print_back_in_the_grammar():
    for text in ("type [3] [a b] [0]", "click [4]", "scroll [up]", "stop [42]", "go_back", "tab_focus [2]"):
        assert str(parse_action(f"```{text}```")) == text


def _node(node_id, role, name="", children=(), backend=None, parent=None, **extra):
    node = {"nodeId": str(node_id), "role": {"value": role}, "name": {"value": name},
            "childIds": [str(c) for c in children], "backendDOMNodeId": backend or node_id, **extra}
    return node


def test_axtree_text_numbers_shown_nodes_in_document_order():
    nodes = [
        _node(1, "RootWebArea", "Shop", [2]),
        _node(2, "generic", "", [3, 5, 7, 9]),  # unnamed container: not shown, children one level up
        _node(3, "link", "Home", [4]),
        _node(4, "StaticText", "Home"),  # the link's own text: not repeated
        _node(5, "searchbox", "Search", [], value={"value": "kettle"}),
        _node(7, "heading", "Blue Kettle", [], properties=[{"name": "level", "value": {"value": 1}}]),
        _node(9, "paragraph", "", [10, 11]),
        _node(10, "StaticText", "Price: $12.99"),
        _node(11, "button", "Buy", [], ignored=True),  # ignored nodes are not shown
    ]
    page = render_axtree(nodes)
    assert page.text.splitlines() == [
        "[1] RootWebArea 'Shop'",
        "\t[2] link 'Home'",
        "\t[3] searchbox 'Search' value: 'kettle'",
        "\t[4] heading 'Blue Kettle' level: 1",
        "\t[5] StaticText 'Price: $12.99'",
    ]
    assert page.find("link", "Home").backend_node_id == 3
    assert page.find("link", "Away") is None
    assert render_axtree([]).text == "(empty page)"


def test_string_match_cleans_and_combines():
    assert clean_answer(' "Blue Kettle" ') == "blue kettle"
    assert string_match("blue kettle", {"exact_match": "Blue Kettle"}) == 1.0
    assert string_match("the blue kettle", {"exact_match": "Blue Kettle"}) == 0.0
    assert string_match("It costs $12.99 now", {"must_include": ["$12.99"]}) == 1.0
    assert string_match("It costs $12.99 now", {"must_include": ["$12.99", "kettle"]}) == 0.0
    assert string_match("cancelled", {"must_include": ["canceled |OR| cancelled"]}) == 1.0
    with pytest.raises(ValueError, match="judge"):
        string_match("x", {"fuzzy_match": ["y"]})
    assert string_match("x", {"fuzzy_match": ["y"]}, judge=lambda q, a, r: (a, r) == ("x", "y")) == 1.0


def test_url_match_compares_path_and_the_references_query():
    assert url_match("http://h:1/category/toys?sort=price&page=2", "http://h:1/category/toys?sort=price") == 1.0
    assert url_match("http://h:1/category/toys/", "http://h:1/category/toys") == 1.0
    assert url_match("http://h:1/category/toys?sort=name", "http://h:1/category/toys?sort=price") == 0.0
    assert url_match("http://h:1/category/garden", "http://h:1/category/toys |OR| http://h:1/category/garden") == 1.0
    # query values compare decoded and case-insensitively: "+" and "%20" are both a space
    assert url_match("http://h:1/search?q=blue%20kettle", "http://h:1/search?q=Blue+Kettle") == 1.0


def test_evaluate_multiplies_every_eval_type():
    task = {"intent": "q", "eval": {
        "eval_types": ["string_match", "url_match", "program_html", "site_state"],
        "reference_answers": {"must_include": ["7"]}, "reference_url": "http://h/orders",
        "program_html": [{"url": "last", "locator": "", "required_contents": {"must_include": ["Order #7"]}}],
        "site_state": [{"site": "shopping", "sql": "SELECT 1", "expected": [[1]]}]}}

    def score(answer="7", url="http://h/orders", text="Order #7 placed", rows=((1,),)):
        return evaluate(task, answer, url, lambda u, loc: text, lambda site, sql: list(rows))

    assert score() == 1.0
    assert score(answer="8") == 0.0
    assert score(url="http://h/cart") == 0.0
    assert score(text="Order #8") == 0.0
    assert score(rows=((2,),)) == 0.0
    assert contents_match("Total: $3.00", {"exact_match": "total: $3.00"}) == 1.0


@pytest.fixture(scope="module")
def shop():
    databases = TenantDatabases(lambda: build_shop(0))
    return databases, TestClient(shop_app(databases))


def test_the_shop_is_deterministic_and_sized():
    first, second = build_shop(0), build_shop(0)
    assert list(first.iterdump()) == list(second.iterdump())
    assert list(build_shop(1).iterdump()) != list(first.iterdump())
    assert first.execute("SELECT COUNT(*) FROM products").fetchone()[0] >= 250
    assert money(1299) == "$12.99" and money(5) == "$0.05"


def test_tenants_have_their_own_cart_and_reset_restores_the_pristine_state(shop):
    databases, client = shop
    pristine = list(databases.pristine.iterdump())
    client.post("/cart/add", data={"product_id": "3", "quantity": "2"}, headers={TENANT_HEADER: "a"})
    client.post("/checkout", headers={TENANT_HEADER: "a"})  # the cart becomes order 16
    client.post("/account", data={"street": "1 New Road", "city": "Bay", "zip": "1"}, headers={TENANT_HEADER: "a"})
    assert client.get("/orders/16", headers={TENANT_HEADER: "a"}).status_code == 200
    assert client.get("/orders/16", headers={TENANT_HEADER: "b"}).status_code == 404  # another tenant: untouched
    assert list(databases.database("a").iterdump()) != pristine
    databases.reset("a")
    assert list(databases.database("a").iterdump()) == pristine
    assert list(databases.database("b").iterdump()) == pristine


def test_shop_pages_answer_and_bad_input_is_a_page_not_an_error(shop):
    _, client = shop
    assert "Kitchen" in client.get("/").text
    assert "products found" in client.get("/search?q=kettle").text
    assert client.get("/product/99999").status_code == 404
    assert client.get("/category/nothing").status_code == 404
    assert client.post("/cart/add", data={"product_id": "x"}).status_code == 404
    page = client.post("/admin/product/1", data={"price": "free", "stock": "2"}, headers={TENANT_HEADER: "c"})
    assert "must be a positive number" in page.text


@pytest.fixture(scope="module")
def forum():
    databases = TenantDatabases(lambda: build_forum(0))
    return databases, TestClient(forum_app(databases))


def test_forum_votes_toggle_and_posts_are_checked(forum):
    databases, client = forum
    score = databases.query("v", "SELECT score FROM posts WHERE id = 5")[0][0]
    vote = {"post_id": "5", "direction": "1"}
    client.post("/vote", data=vote, headers={TENANT_HEADER: "v"})
    assert databases.query("v", "SELECT score FROM posts WHERE id = 5")[0][0] == score + 1
    client.post("/vote", data={**vote, "direction": "-1"}, headers={TENANT_HEADER: "v"})  # up -> down: -2
    assert databases.query("v", "SELECT score FROM posts WHERE id = 5")[0][0] == score - 1
    client.post("/vote", data={**vote, "direction": "-1"}, headers={TENANT_HEADER: "v"})  # again: taken back
    assert databases.query("v", "SELECT score, (SELECT COUNT(*) FROM votes) FROM posts WHERE id = 5")[0] == (score, 0)
    board, title = databases.query("v", "SELECT board, title FROM posts WHERE id = 1")[0]
    page = client.post(f"/f/{board}/submit", data={"title": title, "body": "x"}, headers={TENANT_HEADER: "v"})
    assert "exists already" in page.text
    client.post(f"/f/{board}/submit", data={"title": "New one", "body": "Hi"}, headers={TENANT_HEADER: "v"})
    client.post(f"/f/{board}/1/comment", data={"body": "Nice"}, headers={TENANT_HEADER: "v"})
    assert databases.query("v", f"SELECT title FROM posts WHERE author = '{ME}'") == [("New one",)]
    assert databases.query("v", f"SELECT post_id, body FROM comments WHERE author = '{ME}'") == [(1, "Nice")]
    assert client.get("/f/nowhere").status_code == 404 and client.get(f"/f/{board}/99999").status_code == 404
    databases.reset("v")
    assert list(databases.database("v").iterdump()) == list(databases.pristine.iterdump())


def test_embedded_tasks_split_and_kinds():
    shop_test, shop_train = shop_tasks.shop_tasks(build_shop(0))
    forum_test, forum_train = forum_tasks.forum_tasks(build_forum(0))
    assert len(shop_test) == TEST_PER_TEMPLATE * len(shop_tasks.TEMPLATES)
    assert len(shop_test + forum_test) >= 50 and len(shop_train + forum_train) >= 100
    kinds = {"info", "navigation", "state"}
    assert {task["category"] for task in shop_test + forum_test} == {f"{site}/{kind}" for site in ("shopping", "reddit")
                                                                     for kind in kinds}
    intents = [task["intent"] for task in shop_test + shop_train + forum_test + forum_train]
    assert len(set(intents)) == len(intents)
    for task in shop_test + forum_train:  # WebArena's keys, plus our category and expert plan
        assert {"sites", "start_url", "intent", "intent_template", "instantiation_dict", "require_reset",
                "eval", "category", "expert"} <= set(task)
        assert task["expert"][-1]["do"] == "stop"


def test_a_site_answers_without_waiting_for_delayed_acks():
    """Nagle's algorithm is off on the site's socket (its connections inherit it): with it on,
    each response on a reused connection waited 40 ms for the client's ACK of its headers."""
    server = SiteServer(shop_app(TenantDatabases(lambda: build_shop(0))), "shopping")
    try:
        assert server.listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        server.close()
