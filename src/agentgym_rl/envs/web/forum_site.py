"""The forum: boards, posts sorted three ways, comments, votes, search and user pages, as
plain server-rendered HTML (see `shop_site.py` for why). The signed-in user is
`forum_data.ME`."""

from __future__ import annotations

from html import escape

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from .forum_data import ME
from .site_server import TenantDatabases, form_fields, tenant_of, to_int

SORTS = {"new": "p.posted DESC, p.id DESC", "top": "p.score DESC, p.id", "title": "p.title"}


def forum_app(databases: TenantDatabases) -> Starlette:
    """The forum's ASGI app over `databases` (built with `forum_data.build_forum`)."""

    def run(request: Request, sql: str, parameters: tuple = ()) -> list[tuple]:
        return databases.query(tenant_of(request), sql, parameters)

    def write(request: Request, statements: list[tuple[str, tuple]]) -> None:
        databases.write(tenant_of(request), statements)

    def render(title: str, body: str, status: int = 200) -> HTMLResponse:
        nav = (f'<nav aria-label="Main"><a href="/">Forums</a> <a href="/user/{ME}">{ME}</a></nav>'
               '<form action="/search" role="search"><input type="search" name="q" aria-label="Search posts">'
               '<button type="submit">Search</button></form>')
        return HTMLResponse(f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)} | "
                            f"Postmill</title></head><body><header>{nav}</header><main><h1>{escape(title)}</h1>{body}"
                            "</main></body></html>", status_code=status)

    def post_list(rows: list[tuple]) -> str:
        if not rows:
            return "<p>No posts.</p>"
        items = "".join(
            f'<article><h2><a href="/f/{board}/{pid}">{escape(title)}</a></h2><p>{score} points, by '
            f'<a href="/user/{author}">{author}</a> in <a href="/f/{board}">f/{board}</a>, {comments} comments</p></article>'
            for pid, board, title, author, score, comments in rows)
        return items

    posts_sql = ("SELECT p.id, p.board, p.title, p.author, p.score, COUNT(c.id) FROM posts p "
                 "LEFT JOIN comments c ON c.post_id = p.id {where} GROUP BY p.id ORDER BY {order}")

    async def home(request: Request) -> Response:
        rows = run(request, "SELECT b.name, b.description, COUNT(p.id) FROM boards b LEFT JOIN posts p ON p.board = b.name "
                            "GROUP BY b.name ORDER BY b.name")
        items = "".join(f'<li><a href="/f/{name}">f/{name}</a> {escape(description)} ({count} posts)</li>'
                        for name, description, count in rows)
        return render("Forums", f"<ul>{items}</ul>")

    async def board(request: Request) -> Response:
        name = request.path_params["board"]
        if not run(request, "SELECT 1 FROM boards WHERE name = ?", (name,)):
            return render("Page not found", f"<p>There is no forum f/{escape(name)}.</p>", 404)
        order = SORTS.get(request.query_params.get("sort", "new"), SORTS["new"])
        rows = run(request, posts_sql.format(where="WHERE p.board = ?", order=order), (name,))
        sorts = " ".join(f'<a href="/f/{name}?sort={key}">Sort by {key}</a>' for key in SORTS)
        return render(f"f/{name}", f'<p>{sorts}</p><p><a href="/f/{name}/submit">Submit a new post</a></p>{post_list(rows)}')

    async def submit(request: Request) -> Response:
        name = request.path_params["board"]
        if not run(request, "SELECT 1 FROM boards WHERE name = ?", (name,)):
            return render("Page not found", f"<p>There is no forum f/{escape(name)}.</p>", 404)
        note = ""
        if request.method == "POST":
            form = await form_fields(request)
            title, body = form.get("title", ""), form.get("body", "")
            if not title or not body:
                note = "<p>A post needs a title and a text.</p>"
            elif run(request, "SELECT 1 FROM posts WHERE title = ?", (title,)):
                note = "<p>A post with that title exists already.</p>"
            else:
                post_id = run(request, "SELECT MAX(id) + 1 FROM posts")[0][0]
                write(request, [("INSERT INTO posts VALUES (?, ?, ?, ?, ?, 1, '2026-12-01')", (post_id, name, ME, title, body))])
                return RedirectResponse(f"/f/{name}/{post_id}", status_code=303)
        body = (f'{note}<form method="post" action="/f/{name}/submit"><label>Title <input name="title"></label>'
                '<label>Text <textarea name="body"></textarea></label><button type="submit">Create post</button></form>')
        return render(f"Submit to f/{name}", body)

    async def post(request: Request) -> Response:
        post_id = request.path_params["post_id"]
        rows = run(request, "SELECT board, author, title, body, score, posted FROM posts WHERE id = ?", (post_id,))
        if not rows or rows[0][0] != request.path_params["board"]:
            return render("Page not found", f"<p>There is no post {post_id} here.</p>", 404)
        board_name, author, title, text, score, posted = rows[0]
        vote = run(request, "SELECT direction FROM votes WHERE post_id = ?", (post_id,))
        mine = vote[0][0] if vote else 0
        buttons = "".join(
            f'<form method="post" action="/vote"><input type="hidden" name="post_id" value="{post_id}">'
            f'<input type="hidden" name="direction" value="{direction}"><button type="submit" '
            f'aria-pressed="{str(mine == direction).lower()}">{label}</button></form>'
            for direction, label in ((1, "Upvote"), (-1, "Downvote")))
        comments = run(request, "SELECT author, body FROM comments WHERE post_id = ? ORDER BY id", (post_id,))
        items = "".join(f'<article><p><a href="/user/{who}">{who}</a> wrote:</p><p>{escape(body)}</p></article>'
                        for who, body in comments)
        body = (f'<p>Posted by <a href="/user/{author}">{author}</a> in <a href="/f/{board_name}">f/{board_name}</a> on {posted}</p>'
                f"<p>Score: {score}</p>{buttons}<p>{escape(text)}</p><h2>{len(comments)} comments</h2>{items}"
                f'<form method="post" action="/f/{board_name}/{post_id}/comment"><label>Comment <textarea name="body">'
                '</textarea></label><button type="submit">Post comment</button></form>')
        return render(title, body)

    async def comment(request: Request) -> Response:
        post_id, board_name = request.path_params["post_id"], request.path_params["board"]
        text = (await form_fields(request)).get("body", "")
        if text and run(request, "SELECT 1 FROM posts WHERE id = ? AND board = ?", (post_id, board_name)):
            comment_id = run(request, "SELECT COALESCE(MAX(id), 0) + 1 FROM comments")[0][0]
            write(request, [("INSERT INTO comments VALUES (?, ?, ?, ?)", (comment_id, post_id, ME, text))])
        return RedirectResponse(f"/f/{board_name}/{post_id}", status_code=303)

    async def vote(request: Request) -> Response:
        form = await form_fields(request)
        post_id, direction = to_int(form.get("post_id"), 0), to_int(form.get("direction"), 0)
        rows = run(request, "SELECT board FROM posts WHERE id = ?", (post_id,))
        if not rows or direction not in (1, -1):
            return render("Page not found", "<p>No such post or vote.</p>", 404)
        previous = run(request, "SELECT direction FROM votes WHERE post_id = ?", (post_id,))
        previous = previous[0][0] if previous else 0
        new = 0 if previous == direction else direction  # voting the same way again takes the vote back
        write(request, [("DELETE FROM votes WHERE post_id = ?", (post_id,)),
                        *([("INSERT INTO votes VALUES (?, ?)", (post_id, new))] if new else []),
                        ("UPDATE posts SET score = score + ? WHERE id = ?", (new - previous, post_id))])
        return RedirectResponse(f"/f/{rows[0][0]}/{post_id}", status_code=303)

    async def search(request: Request) -> Response:
        query = request.query_params.get("q", "").strip()
        words = query.lower().split()
        rows = run(request, posts_sql.format(where="", order="p.title"))
        found = [row for row in rows if words and all(word in row[2].lower() for word in words)]
        return render(f"Search results for '{query}'", f"<p>{len(found)} posts found.</p>{post_list(found[:20])}")

    async def user(request: Request) -> Response:
        name = request.path_params["name"]
        joined = run(request, "SELECT joined FROM users WHERE name = ?", (name,))
        if not joined:
            return render("Page not found", f"<p>There is no user {escape(name)}.</p>", 404)
        rows = run(request, posts_sql.format(where="WHERE p.author = ?", order="p.posted DESC, p.id DESC"), (name,))
        comments = run(request, "SELECT COUNT(*) FROM comments WHERE author = ?", (name,))[0][0]
        return render(name, f"<p>Joined {joined[0][0]}. {len(rows)} posts, {comments} comments.</p>{post_list(rows)}")

    return Starlette(routes=[
        Route("/", home),
        Route("/f/{board}", board),
        Route("/f/{board}/submit", submit, methods=["GET", "POST"]),
        Route("/f/{board}/{post_id:int}", post),
        Route("/f/{board}/{post_id:int}/comment", comment, methods=["POST"]),
        Route("/vote", vote, methods=["POST"]),
        Route("/search", search),
        Route("/user/{name}", user),
    ])
