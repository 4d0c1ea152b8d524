"""The dashboard's pages: topics, groups (lag per queue and over time), message search with body
preview and trace, dead letters with resend, job status.

Every page is read-only except ``POST /dlq/{group}/resend``, which needs the token the server printed
at start. Message bodies, keys and properties are untrusted: Jinja2 autoescapes everything it
renders, so a body holding ``<script>`` is shown as text. The store is used under one lock (the
client objects are not meant to be shared between threads; pages run in Starlette's thread pool).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from engine.client.admin import Admin
from engine.dashboard.sampler import Sampler
from engine.errors import InvalidArgumentError, MQError, TopicNotFoundError
from engine.model import MessageExt
from engine.protocol.times import parse_time
from engine.store.status import store_status
from engine.store.store import Store, now_ms

TEMPLATES = Path(__file__).resolve().parent / "templates"
BODY_PREVIEW = 200
CHART_W, CHART_H = 640, 160
_PERMS = {2: "write", 4: "read", 6: "read+write"}


def _text(body: bytes, limit: int | None = None) -> str:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = "0x" + body.hex()
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def _ts(ms: int | None) -> str:
    return "-" if ms is None else _dt.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="seconds")


def lag_chart(series: list[tuple[int, int]], width: int = CHART_W, height: int = CHART_H) -> str:
    """SVG polyline points for ``(ts_ms, lag)`` samples scaled into a ``width`` x ``height`` box
    (time left to right, lag bottom to top); empty for fewer than two samples."""
    if len(series) < 2:
        return ""
    t0, t1 = series[0][0], series[-1][0]
    top = max(1, max(lag for _, lag in series))
    span = max(1, t1 - t0)
    return " ".join(f"{(ts - t0) * width / span:.1f},{height - lag * height / top:.1f}" for ts, lag in series)


TOPICS_PER_PAGE = 100
"""Topics listed on one page of the dashboard's index (``?page=N``)."""


class Dashboard:
    """The application state: one store, its admin, the sampler and the resend token."""

    def __init__(self, store: Store, token: str | None = None, sampler_interval_s: float = 5.0) -> None:
        self.store = store
        self.admin = Admin(store)
        self.lock = threading.Lock()
        self.token = token or secrets.token_urlsafe(24)
        self.sampler = Sampler(self.admin, self.lock, sampler_interval_s)
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True)
        env.filters["ts"] = _ts
        env.filters["preview"] = lambda body: _text(body, BODY_PREVIEW)
        env.filters["fulltext"] = _text
        env.filters["q"] = lambda text: quote(str(text), safe="")
        env.filters["perm"] = lambda perm: _PERMS.get(perm, str(perm))
        self.env = env

    def page(self, _template: str, _code: int = 200, **context: Any) -> HTMLResponse:
        html = self.env.get_template(_template).render(store=self.store.root, **context)
        return HTMLResponse(html, status_code=_code)

    def guarded(self, render: Callable[[Request], Response]) -> Callable[[Request], Response]:
        """A page whose engine errors become an error page (400, 404 for a missing topic)."""

        def endpoint(request: Request) -> Response:
            try:
                with self.lock:
                    return render(request)
            except TopicNotFoundError as exc:
                return self.page("error.html", 404, error=str(exc))
            except MQError as exc:
                return self.page("error.html", 400, error=str(exc))

        return endpoint

    # ----------------------------------------------------------------- pages
    def index(self, request: Request) -> Response:
        every = self.admin.topics()
        pages = max(1, -(-len(every) // TOPICS_PER_PAGE))
        try:
            number = min(max(int(request.query_params.get("page", "1")), 1), pages)
        except ValueError:
            number = 1
        shown = every[(number - 1) * TOPICS_PER_PAGE : number * TOPICS_PER_PAGE]
        topics = []
        for t in shown:  # one page of topics: the last store time reads an entry per queue
            stats = self.admin.topic_stats(t.name)
            last = max((s.last_store_ts_ms or 0 for s in stats), default=0) or None
            count = sum(s.max_offset - s.min_offset for s in stats)
            topics.append({"config": t, "messages": count, "last": last, "rate": self.sampler.rate(t.name)})
        pager = {"page": number, "pages": pages, "total": len(every)}
        return self.page("index.html", topics=topics, pager=pager, groups=self.admin.groups())

    def topic(self, request: Request) -> Response:
        name = request.path_params["name"]
        return self.page("topic.html", name=name, stats=self.admin.topic_stats(name))

    def groups(self, request: Request) -> Response:
        return self.page("groups.html", groups=self.admin.groups())

    def group(self, request: Request) -> Response:
        group = request.path_params["group"]
        rows = self.admin.group_progress(group)
        series = self.sampler.lag_series(group)
        return self.page(
            "group.html",
            group=group,
            rows=rows,
            points=lag_chart(series),
            samples=len(series),
            peak=max((lag for _, lag in series), default=0),
            width=CHART_W,
            height=CHART_H,
        )

    def messages(self, request: Request) -> Response:
        q = request.query_params
        found: list[MessageExt] = []
        searched = False
        if q.get("id"):
            searched = True
            found = [self.admin.find_message(q["id"].strip())]
        elif q.get("topic"):
            searched = True
            end = parse_time(q["end"]) if q.get("end") else now_ms()
            begin = parse_time(q["begin"]) if q.get("begin") else max(0, end - 72 * 3_600_000)
            if q.get("key"):
                found = self.admin.query_by_key(q["topic"], q["key"].strip(), begin, end)
            else:
                found = self.admin.query_by_time(q["topic"], begin, end)
        elif q.get("key") or q.get("begin") or q.get("end"):
            raise InvalidArgumentError("a search by key or time needs a topic")
        return self.page("messages.html", found=found, searched=searched, q=q)

    def message(self, request: Request) -> Response:
        message = self.admin.find_message(request.path_params["msg_id"])
        trace = self.admin.trace(message.msg_id)
        return self.page("message.html", m=message, trace=trace)

    def dlq(self, request: Request) -> Response:
        group = request.path_params["group"]
        letters = self.admin.dlq_messages(group, 1024)
        return self.page("dlq.html", group=group, letters=letters, resent=request.query_params.get("resent"))

    def jobs(self, request: Request) -> Response:
        return self.page("jobs.html", status=store_status(self.store))

    async def resend(self, request: Request) -> Response:
        group = request.path_params["group"]
        form = {k: v[0] for k, v in parse_qs((await request.body()).decode("utf-8", "replace")).items()}
        if not secrets.compare_digest(form.get("token", "").encode(), self.token.encode()):
            return self.page("error.html", 403, error="resend needs the token mq dashboard printed at start")
        try:
            with self.lock:
                sent = self.admin.resend_dlq(group, form.get("msg_id", ""))
        except MQError as exc:
            return self.page("error.html", 400, error=str(exc))
        return RedirectResponse(f"/dlq/{quote(group, safe='')}?resent={quote(sent.msg_id)}", status_code=303)


def create_app(
    store: Store, *, token: str | None = None, allowed_hosts: list[str] | None = None, sample: bool = True
) -> Starlette:
    """The dashboard application over ``store``.

    Args:
        store: the store shown.
        token: the resend token (default: a new random one; ``app.state.dashboard.token``).
        allowed_hosts: Host headers accepted (default 127.0.0.1 and localhost: a page on another
            site cannot reach the console through DNS rebinding).
        sample: start the background sampler (rates, lag charts).
    """
    board = Dashboard(store, token)
    g = board.guarded
    routes = [
        Route("/", g(board.index)),
        Route("/topics/{name}", g(board.topic)),
        Route("/groups", g(board.groups)),
        Route("/groups/{group}", g(board.group)),
        Route("/messages", g(board.messages)),
        Route("/messages/{msg_id}", g(board.message)),
        Route("/dlq/{group}", g(board.dlq)),
        Route("/dlq/{group}/resend", board.resend, methods=["POST"]),
        Route("/jobs", g(board.jobs)),
    ]
    hosts = allowed_hosts or ["127.0.0.1", "localhost"]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if sample:
            board.sampler.start()
        try:
            yield
        finally:
            board.sampler.stop()

    app = Starlette(
        routes=routes, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts)], lifespan=lifespan
    )
    app.state.dashboard = board
    return app
