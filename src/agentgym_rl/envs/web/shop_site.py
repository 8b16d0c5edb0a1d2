"""The online shop: catalogue, search, product pages with reviews, cart, checkout, order
history, account and an admin view, as plain server-rendered HTML (no JavaScript), so its
accessibility tree is what the agent reads.

Pages are written for that tree: every control has a visible label or an `aria-label`, and
there is no `<select>` (a headless browser cannot pick from its native pop-up by clicking).
"""

from __future__ import annotations

from html import escape
from urllib.parse import quote_plus

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from .shop_data import money
from .site_server import TenantDatabases, form_fields, tenant_of, to_int

SORTS = {"name": "name", "price": "price_cents, name", "rating": "rating DESC, name"}
PAGE_SIZE = 20


def _page(title: str, body: str, cart_count: int) -> HTMLResponse:
    nav = (f'<nav aria-label="Main"><a href="/">Home</a> <a href="/cart">Cart ({cart_count})</a> '
           '<a href="/orders">My orders</a> <a href="/account">My account</a> <a href="/admin">Admin</a></nav>'
           '<form action="/search" role="search"><input type="search" name="q" aria-label="Search products">'
           '<button type="submit">Search</button></form>')
    return HTMLResponse(f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)} | "
                        f"One Stop Market</title></head><body><header>{nav}</header><main><h1>{escape(title)}</h1>"
                        f"{body}</main></body></html>")


def _product_list(rows: list[tuple]) -> str:
    if not rows:
        return "<p>No products found.</p>"
    items = "".join(f'<li><a href="/product/{pid}">{escape(name)}</a> {money(price)}</li>' for pid, name, price, *_ in rows)
    return f"<ul>{items}</ul>"


def shop_app(databases: TenantDatabases) -> Starlette:
    """The shop's ASGI app over `databases` (built with `shop_data.build_shop`)."""

    def run(request: Request, sql: str, parameters: tuple = ()) -> list[tuple]:
        return databases.query(tenant_of(request), sql, parameters)

    def write(request: Request, statements: list[tuple[str, tuple]]) -> None:
        databases.write(tenant_of(request), statements)

    def render(request: Request, title: str, body: str) -> HTMLResponse:
        count = run(request, "SELECT COALESCE(SUM(quantity), 0) FROM cart_items")[0][0]
        return _page(title, body, count)

    def not_found(request: Request, what: str) -> HTMLResponse:
        response = render(request, "Page not found", f"<p>{escape(what)} does not exist.</p>")
        response.status_code = 404
        return response

    async def home(request: Request) -> Response:
        categories = run(request, "SELECT slug, name FROM categories ORDER BY name")
        links = "".join(f'<li><a href="/category/{slug}">{escape(name)}</a></li>' for slug, name in categories)
        featured = run(request, "SELECT id, name, price_cents FROM products ORDER BY stock DESC, id LIMIT 5")
        return render(request, "Welcome", f"<h2>Categories</h2><ul>{links}</ul><h2>Popular products</h2>{_product_list(featured)}")

    async def search(request: Request) -> Response:
        query = request.query_params.get("q", "").strip()
        words = query.lower().split()
        rows = run(request, "SELECT id, name, price_cents FROM products ORDER BY name")
        found = [row for row in rows if words and all(word in row[1].lower() for word in words)]
        title = f"Search results for '{query}'"
        return render(request, title, f"<p>{len(found)} products found.</p>{_product_list(found[:PAGE_SIZE])}")

    async def category(request: Request) -> Response:
        slug = request.path_params["slug"]
        named = run(request, "SELECT name FROM categories WHERE slug = ?", (slug,))
        if not named:
            return not_found(request, f"Category {slug!r}")
        sort = request.query_params.get("sort", "name")
        order = SORTS.get(sort, SORTS["name"])
        rows = run(request, "SELECT p.id, p.name, p.price_cents, COALESCE(AVG(r.stars), 0) AS rating FROM products p "
                            f"LEFT JOIN reviews r ON r.product_id = p.id WHERE p.category = ? GROUP BY p.id ORDER BY {order}",
                   (slug,))
        sorts = " · ".join(f'<a href="/category/{slug}?sort={key}">Sort by {key}</a>' for key in SORTS)
        return render(request, named[0][0], f"<p>{sorts}</p><p>{len(rows)} products.</p>{_product_list(rows)}")

    async def product(request: Request) -> Response:
        product_id = request.path_params["product_id"]
        rows = run(request, "SELECT p.name, p.price_cents, p.stock, p.description, c.name, c.slug FROM products p "
                            "JOIN categories c ON c.slug = p.category WHERE p.id = ?", (product_id,))
        if not rows:
            return not_found(request, f"Product {product_id}")
        name, price, stock, description, category_name, slug = rows[0]
        reviews = run(request, "SELECT author, stars, title, body FROM reviews WHERE product_id = ? ORDER BY id", (product_id,))
        rating = f"{sum(r[1] for r in reviews) / len(reviews):.1f} out of 5" if reviews else "no rating yet"
        review_items = "".join(
            f"<article><h3>{escape(title)}</h3><p>{stars} stars, by {escape(author)}</p><p>{escape(body)}</p></article>"
            for author, stars, title, body in reviews)
        availability = f"{stock} in stock" if stock else "Out of stock"
        buy = ('<form method="post" action="/cart/add"><input type="hidden" name="product_id" value="'
               f'{product_id}"><label>Quantity <input type="number" name="quantity" value="1" min="1"></label>'
               '<button type="submit">Add to cart</button></form>') if stock else ""
        body = (f'<p>Category: <a href="/category/{slug}">{escape(category_name)}</a></p><p>Price: {money(price)}</p>'
                f"<p>{availability}</p><p>Rating: {rating}</p><p>{escape(description)}</p>{buy}"
                f"<h2>Reviews ({len(reviews)})</h2>{review_items or '<p>No reviews yet.</p>'}")
        return render(request, name, body)

    async def cart(request: Request) -> Response:
        rows = run(request, "SELECT p.id, p.name, p.price_cents, c.quantity FROM cart_items c "
                            "JOIN products p ON p.id = c.product_id ORDER BY p.name")
        if not rows:
            return render(request, "Shopping cart", "<p>Your cart is empty.</p>")
        lines = "".join(
            f'<tr><td><a href="/product/{pid}">{escape(name)}</a></td><td>{quantity}</td><td>{money(price * quantity)}</td>'
            f'<td><form method="post" action="/cart/remove"><input type="hidden" name="product_id" value="{pid}">'
            f'<button type="submit" aria-label="Remove {escape(name)}">Remove</button></form></td></tr>'
            for pid, name, price, quantity in rows)
        total = sum(price * quantity for _, _, price, quantity in rows)
        body = (f"<table><tr><th>Product</th><th>Quantity</th><th>Subtotal</th><th></th></tr>{lines}</table>"
                f'<p>Total: {money(total)}</p><p><a href="/checkout">Proceed to checkout</a></p>')
        return render(request, "Shopping cart", body)

    async def cart_add(request: Request) -> Response:
        form = await form_fields(request)
        product_id, quantity = to_int(form.get("product_id"), 0), to_int(form.get("quantity"), 1)
        if not run(request, "SELECT 1 FROM products WHERE id = ?", (product_id,)) or quantity < 1:
            return not_found(request, "That product or quantity")
        write(request, [("INSERT INTO cart_items VALUES (?, ?) ON CONFLICT(product_id) DO UPDATE SET "
                         "quantity = quantity + excluded.quantity", (product_id, quantity))])
        return RedirectResponse("/cart", status_code=303)

    async def cart_remove(request: Request) -> Response:
        form = await form_fields(request)
        write(request, [("DELETE FROM cart_items WHERE product_id = ?", (to_int(form.get("product_id"), 0),))])
        return RedirectResponse("/cart", status_code=303)

    async def checkout(request: Request) -> Response:
        rows = run(request, "SELECT SUM(p.price_cents * c.quantity), COUNT(*) FROM cart_items c JOIN products p ON p.id = c.product_id")
        total, count = rows[0]
        if request.method == "POST":
            if not count:
                return RedirectResponse("/cart", status_code=303)
            street, city, zip_code = run(request, "SELECT street, city, zip FROM customer")[0]
            order_id = run(request, "SELECT COALESCE(MAX(id), 0) + 1 FROM orders")[0][0]
            write(request, [
                ("INSERT INTO orders VALUES (?, '2026-12-01', 'pending', ?, ?, ?)", (order_id, street, city, zip_code)),
                ("INSERT INTO order_items SELECT ?, c.product_id, c.quantity, p.price_cents FROM cart_items c "
                 "JOIN products p ON p.id = c.product_id", (order_id,)),
                ("DELETE FROM cart_items", ()),
            ])
            return RedirectResponse(f"/orders/{order_id}", status_code=303)
        if not count:
            return render(request, "Checkout", '<p>Your cart is empty.</p>')
        name, street, city, zip_code = run(request, "SELECT name, street, city, zip FROM customer")[0]
        body = (f"<p>Ship to: {escape(name)}, {escape(street)}, {escape(city)} {escape(zip_code)}</p>"
                f'<p>Order total: {money(total)}</p><form method="post" action="/checkout">'
                '<button type="submit">Place order</button></form>')
        return render(request, "Checkout", body)

    async def orders(request: Request) -> Response:
        rows = run(request, "SELECT o.id, o.placed, o.status, SUM(i.price_cents * i.quantity) FROM orders o "
                            "JOIN order_items i ON i.order_id = o.id GROUP BY o.id ORDER BY o.id DESC")
        lines = "".join(f'<tr><td><a href="/orders/{oid}">Order #{oid}</a></td><td>{placed}</td><td>{status}</td>'
                        f"<td>{money(total)}</td></tr>" for oid, placed, status, total in rows)
        return render(request, "My orders", f"<table><tr><th>Order</th><th>Date</th><th>Status</th><th>Total</th></tr>{lines}</table>")

    async def order(request: Request) -> Response:
        order_id = request.path_params["order_id"]
        head = run(request, "SELECT placed, status, street, city, zip FROM orders WHERE id = ?", (order_id,))
        if not head:
            return not_found(request, f"Order #{order_id}")
        placed, status, street, city, zip_code = head[0]
        items = run(request, "SELECT p.id, p.name, i.quantity, i.price_cents FROM order_items i "
                             "JOIN products p ON p.id = i.product_id WHERE i.order_id = ? ORDER BY p.name", (order_id,))
        lines = "".join(f'<tr><td><a href="/product/{pid}">{escape(name)}</a></td><td>{quantity}</td><td>{money(price)}</td></tr>'
                        for pid, name, quantity, price in items)
        total = sum(quantity * price for _, _, quantity, price in items)
        body = (f"<p>Placed on {placed}. Status: {status}.</p><p>Shipped to {escape(street)}, {escape(city)} {escape(zip_code)}</p>"
                f"<table><tr><th>Product</th><th>Quantity</th><th>Price</th></tr>{lines}</table><p>Order total: {money(total)}</p>")
        return render(request, f"Order #{order_id}", body)

    async def account(request: Request) -> Response:
        if request.method == "POST":
            form = await form_fields(request)
            fields = {key: form.get(key, "") for key in ("street", "city", "zip")}
            if all(fields.values()):
                write(request, [("UPDATE customer SET street = ?, city = ?, zip = ?", tuple(fields.values()))])
                return RedirectResponse("/account?saved=1", status_code=303)
        name, email, street, city, zip_code = run(request, "SELECT name, email, street, city, zip FROM customer")[0]
        note = "<p>Your address was saved.</p>" if request.query_params.get("saved") else ""
        if request.method == "POST":
            note = "<p>Street, city and ZIP code are all needed.</p>"
        body = (f"{note}<p>Name: {escape(name)}</p><p>Email: {escape(email)}</p><h2>Shipping address</h2>"
                f'<form method="post" action="/account"><label>Street <input name="street" value="{escape(street)}"></label>'
                f'<label>City <input name="city" value="{escape(city)}"></label>'
                f'<label>ZIP code <input name="zip" value="{escape(zip_code)}"></label><button type="submit">Save address</button></form>')
        return render(request, "My account", body)

    async def admin(request: Request) -> Response:
        query = request.query_params.get("q", "").strip().lower()
        rows = run(request, "SELECT id, name, price_cents, stock FROM products ORDER BY id")
        shown = [row for row in rows if query in row[1].lower()][:PAGE_SIZE] if query else rows[:PAGE_SIZE]
        lines = "".join(f'<tr><td>{pid}</td><td><a href="/admin/product/{pid}" aria-label="Edit {escape(name)}">'
                        f"{escape(name)}</a></td><td>{money(price)}</td><td>{stock}</td></tr>" for pid, name, price, stock in shown)
        counts = run(request, "SELECT status, COUNT(*) FROM orders GROUP BY status ORDER BY status")
        statuses = "".join(f"<li>{status}: {count}</li>" for status, count in counts)
        body = ('<form action="/admin"><input type="search" name="q" aria-label="Filter products by name">'
                '<button type="submit">Filter</button></form>'
                f"<table><tr><th>ID</th><th>Product</th><th>Price</th><th>Stock</th></tr>{lines}</table>"
                f"<h2>Orders by status</h2><ul>{statuses}</ul>")
        return render(request, "Admin: products", body)

    async def admin_product(request: Request) -> Response:
        product_id = request.path_params["product_id"]
        if request.method == "POST":
            form = await form_fields(request)
            try:
                cents = round(float(form.get("price", "").lstrip("$")) * 100)
                stock = int(form.get("stock", ""))
            except ValueError:
                cents = stock = -1
            if cents > 0 and stock >= 0:
                write(request, [("UPDATE products SET price_cents = ?, stock = ? WHERE id = ?", (cents, stock, product_id))])
                return RedirectResponse(f"/admin/product/{product_id}?saved=1", status_code=303)
        rows = run(request, "SELECT name, price_cents, stock FROM products WHERE id = ?", (product_id,))
        if not rows:
            return not_found(request, f"Product {product_id}")
        name, price, stock = rows[0]
        note = "<p>Saved.</p>" if request.query_params.get("saved") else ""
        if request.method == "POST":
            note = "<p>The price must be a positive number and the stock a whole number.</p>"
        body = (f'{note}<p>Product: {escape(name)}</p><form method="post" action="/admin/product/{product_id}">'
                f'<label>Price <input name="price" value="{price / 100:.2f}"></label>'
                f'<label>Stock <input type="number" name="stock" value="{stock}"></label>'
                '<button type="submit">Save product</button></form>')
        return render(request, f"Admin: edit product {product_id}", body)

    return Starlette(routes=[
        Route("/", home),
        Route("/search", search),
        Route("/category/{slug}", category),
        Route("/product/{product_id:int}", product),
        Route("/cart", cart),
        Route("/cart/add", cart_add, methods=["POST"]),
        Route("/cart/remove", cart_remove, methods=["POST"]),
        Route("/checkout", checkout, methods=["GET", "POST"]),
        Route("/orders", orders),
        Route("/orders/{order_id:int}", order),
        Route("/account", account, methods=["GET", "POST"]),
        Route("/admin", admin),
        Route("/admin/product/{product_id:int}", admin_product, methods=["GET", "POST"]),
    ])


def search_url(query: str) -> str:
    """The path of the shop's search results for `query`, as its search form submits it."""
    return f"/search?q={quote_plus(query)}"
