"""The web view's routes: sign-in and sign-out, the fleet page, a computer page, their live
fragments and a computer's history as JSON for the charts.

Every page needs a session (see `rbroker_server.web.sessions`); without one, pages redirect
to `/signin` and their live fragments (`…/live`) answer 401 so the page's script can send
the browser there.
Forms carry a CSRF token: the session's, or before sign-in a random one also set in a
short-lived SameSite=Strict cookie (double submit); masked afresh in every response.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from litestar import Controller, Request, Response, get, post
from litestar.datastructures import CacheControlHeader, Cookie
from litestar.di import NamedDependency
from litestar.enums import MediaType, RequestEncodingType
from litestar.exceptions import NotAuthorizedException, NotFoundException
from litestar.params import Body, FromPath
from litestar.response import Redirect, Template
from markupsafe import Markup
from sqlalchemy.engine import Engine

from rbroker_protocol.fleet import HistoryView
from rbroker_server.admin.audit import RefusalBound
from rbroker_server.auth.caller import Scope, Unauthenticated
from rbroker_server.db.engine import utcnow
from rbroker_server.edge import ratelimit
from rbroker_server.edge.ratelimit import Throttles, client_address
from rbroker_server.fleet import service as fleet_service
from rbroker_server.settings import Settings
from rbroker_server.web import page_models as pages
from rbroker_server.web import renders, sessions
from rbroker_server.web.renders import SharedRenders

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"

SESSION_COOKIE = "rbroker_session"
PAGE_OPT = "rbroker_web_page"
"""The route option that marks the web view's handlers (`fault_page.is_page`)."""
SIGNIN_CSRF_COOKIE = "rbroker_signin_csrf"
SIGNIN_ATTEMPTS = ratelimit.SIGNIN_ATTEMPTS
"""Sign-in attempts per client address: a burst of 10, then one every 6 s."""
SETTINGS_STATE = "settings"
"""Key of the coordinator's `Settings` in the app's `state` (read where no handler has them)."""
REFRESH_MS = 5000
"""The pages refresh their figures every 5 s, the brokers' report interval."""

COLOURS = {
    "leased": "#2f6fdb",
    "reserved": "url(#hatch-reserved)",
    "others": "#e08a2c",
    "available": "#3aa55d",
    "headroom": "url(#hatch-headroom)",
}
"""The tray's colours (rbroker.tray.widgets); granted-not-yet-used and headroom hatched."""

FormData = Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)]


def base_path(request: Request[Any, Any, Any]) -> str:
    """The prefix the app is mounted under (ASGI `root_path`, from `external_url` whether
    the proxy kept or stripped it), percent-encoded for URLs and cookie paths, without a
    trailing slash (e.g. `/lab%20tools/rbroker`; '' at the root)."""
    root = str(request.scope.get("root_path", "") or "").rstrip("/")
    return quote(root, safe="/!$&'()*+,;=:@~", errors="surrogateescape")


def _secure(request: Request[Any, Any, Any]) -> bool:
    """Cookies get `Secure` when the browser reaches the coordinator over HTTPS: served over
    TLS here, or an `https://` external URL (TLS ended at a reverse proxy)."""
    settings: Settings = request.app.state.get(SETTINGS_STATE) or Settings()
    return request.url.scheme == "https" or settings.external_url.lower().startswith("https:")


def _cookie_path(request: Request[Any, Any, Any]) -> str:
    return base_path(request) or "/"


def page_context(request: Request[Any, Any, Any], **context: Any) -> dict[str, Any]:
    """What every page's template gets (base path, colours, helpers), plus `context`; a
    `csrf_token` in it is masked for the form."""
    if context.get("csrf_token"):
        context["csrf_token"] = sessions.mask_token(context["csrf_token"])
    return {
        "base": base_path(request),
        "group": None,
        "csrf_token": None,
        "colours": COLOURS,
        "fmt_mib": pages.fmt_mib,
        "age_text": fleet_service.age_text,
        "queue_eta": pages.queue_eta,
        "refresh_ms": REFRESH_MS,
        **context,
    }


def signed_in(request: Request[Any, Any, Any], engine: Engine) -> sessions.SignedIn | None:
    """The request's session (its cookie's), or None: none sent, unknown or expired."""
    return sessions.lookup(engine, request.cookies.get(SESSION_COOKIE))


def to_signin(request: Request[Any, Any, Any]) -> Redirect:
    """A page's answer without a session: to the sign-in page (303), the cookie cleared."""
    return Redirect(
        path=f"{base_path(request)}/signin",
        status_code=303,
        cookies=[
            Cookie(
                key=SESSION_COOKIE,
                value="",
                max_age=0,
                path=_cookie_path(request),
                httponly=True,
                secure=_secure(request),
                samesite="strict",
            )
        ],
    )


def message_page(
    request: Request[Any, Any, Any],
    signed: sessions.SignedIn,
    heading: str,
    message: str,
    status_code: int,
) -> Template:
    """A signed-in page that says only `heading` and `message` (e.g. 404 for a computer
    the group does not have, 400 for a query a page does not take)."""
    return Template(
        template_name="message.html",
        context=page_context(
            request, csrf_token=signed.csrf_token, heading=heading, message=message
        ),
        status_code=status_code,
    )


def _signin_page(
    request: Request[Any, Any, Any], error: str | None = None, status_code: int = 200
) -> Template:
    token = secrets.token_urlsafe(32)
    return Template(
        template_name="signin.html",
        context=page_context(request, error=error, signin_csrf=sessions.mask_token(token)),
        status_code=status_code,
        cookies=[
            Cookie(
                key=SIGNIN_CSRF_COOKIE,
                value=token,
                max_age=3600,
                path=_cookie_path(request),
                httponly=True,
                secure=_secure(request),
                samesite="strict",
            )
        ],
    )


def _render_fleet(
    request: Request[Any, Any, Any], engine: Engine, settings: Settings, scope: Scope
) -> tuple[str, str, str, str]:
    """The group's fleet fragment, shared by all its viewers (nothing of one session in
    it): (group id, group name, the "As of" line, the computers' table)."""
    view, states = fleet_service.fleet_summary(engine, settings, scope)
    context = page_context(
        request,
        group=view.group,
        generated_at=view.generated_at,
        stale_after_s=view.stale_after_s,
        offline_after_s=view.offline_after_s,
        rows=pages.fleet_rows(view.computers, states, view.generated_at),
    )
    templates = request.app.template_engine
    assert templates is not None  # create_app configures one
    head = templates.get_template("fleet_asof.html").render(**context)
    body = templates.get_template("fleet_live.html").render(**context)
    return str(scope.group_id), view.group, head, body


def _etag_matches(request: Request[Any, Any, Any], etag: str) -> bool:
    """Whether `If-None-Match` names `etag` (weak or strong, in a list)."""
    sent = request.headers.get("if-none-match")
    if not sent:
        return False
    return etag in (t.strip().removeprefix("W/") for t in sent.split(","))


def _fleet(
    request: Request[Any, Any, Any], engine: Engine, settings: Settings, *, fragment: bool
) -> Template | Redirect | Response[str]:
    signed = signed_in(request, engine)
    if signed is None:
        if fragment:
            raise NotAuthorizedException("signed out")
        return to_signin(request)
    shared: SharedRenders = request.app.state[renders.STATE_KEY]
    scope = signed.scope
    made = shared.get(
        (scope.group_id, base_path(request)),
        lambda: _render_fleet(request, engine, settings, scope),
    )
    if fragment:
        if _etag_matches(request, made.etag):
            return Response("", status_code=304, headers={"ETag": made.etag})
        return Response(made.html, media_type=MediaType.HTML, headers={"ETag": made.etag})
    context = page_context(
        request, group=made.group, csrf_token=signed.csrf_token, live_html=Markup(made.html)
    )
    return Template(template_name="fleet.html", context=context)


def _computer(
    request: Request[Any, Any, Any],
    computer_id: str,
    engine: Engine,
    settings: Settings,
    *,
    fragment: bool,
) -> Template | Redirect:
    signed = signed_in(request, engine)
    if signed is None:
        if fragment:
            raise NotAuthorizedException("signed out")
        return to_signin(request)
    now = utcnow()
    try:
        view = fleet_service.computer(engine, settings, signed.scope, computer_id)
    except fleet_service.ComputerNotFound:
        return message_page(
            request, signed, "No such computer", "This group has no computer with that id.", 404
        )
    context = page_context(
        request,
        csrf_token=signed.csrf_token,
        generated_at=now,
        page=pages.computer_pages(engine, [view], now)[0],
        history_window_s=settings.history_window_s,
        list_cap=pages.LIST_CAP,
        history_step_s=settings.history_step_s,
    )
    return Template(
        template_name="computer_live.html" if fragment else "computer.html", context=context
    )


class WebController(Controller):
    """Server-rendered pages of the group a session was signed in for."""

    path = "/"
    include_in_schema = False
    cache_control = CacheControlHeader(no_store=True)
    opt = {PAGE_OPT: True}  # noqa: RUF012 - Litestar's layered option, read per request

    @get("/", sync_to_thread=True)
    def index(self, request: Request[Any, Any, Any], engine: NamedDependency[Engine]) -> Redirect:
        """To the fleet when signed in, else to the sign-in page."""
        target = "/fleet" if signed_in(request, engine) else "/signin"
        return Redirect(path=f"{base_path(request)}{target}", status_code=303)

    @get("/signin", sync_to_thread=True)
    def signin_form(
        self, request: Request[Any, Any, Any], engine: NamedDependency[Engine]
    ) -> Template | Redirect:
        """The sign-in form (or the fleet when already signed in)."""
        if signed_in(request, engine):
            return Redirect(path=f"{base_path(request)}/fleet", status_code=303)
        return _signin_page(request)

    @post("/signin", sync_to_thread=True, status_code=303)
    def signin(
        self,
        request: Request[Any, Any, Any],
        data: FormData,
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
    ) -> Template | Redirect:
        """Check the viewer token; on success a session cookie and a redirect to the fleet.

        401 for a wrong, revoked or malformed token (one message for all), 403 for a missing
        or wrong CSRF token, 429 with Retry-After past `SIGNIN_ATTEMPTS` per minute.
        """
        throttle = Throttles.of(request).signin
        address = client_address(request)
        retry_after = throttle.refusal_s(address)
        if retry_after:
            page = _signin_page(
                request,
                f"Too many sign-in attempts from your address; try again in {retry_after} s.",
                429,
            )
            page.headers["Retry-After"] = str(retry_after)
            return page
        throttle.spend(address)
        if not sessions.csrf_matches(
            request.cookies.get(SIGNIN_CSRF_COOKIE), data.get("csrf_token")
        ):
            return _signin_page(
                request, "The form expired or was not sent from this page; try again.", 403
            )
        try:
            session_id, _ = sessions.sign_in(engine, settings, data.get("token", ""))
        except Unauthenticated:
            sessions.record_refusal(engine, request.app.state[RefusalBound.STATE_KEY], address)
            return _signin_page(request, "That token is unknown or revoked.", 401)
        return Redirect(
            path=f"{base_path(request)}/fleet",
            status_code=303,
            cookies=[
                Cookie(
                    key=SESSION_COOKIE,
                    value=session_id,
                    max_age=int(sessions.SESSION_TTL_S),
                    path=_cookie_path(request),
                    httponly=True,
                    secure=_secure(request),
                    samesite="strict",
                ),
                Cookie(
                    key=SIGNIN_CSRF_COOKIE,
                    value="",
                    max_age=0,
                    path=_cookie_path(request),
                    httponly=True,
                    secure=_secure(request),
                    samesite="strict",
                ),
            ],
        )

    @post("/signout", sync_to_thread=True, status_code=303)
    def signout(
        self, request: Request[Any, Any, Any], data: FormData, engine: NamedDependency[Engine]
    ) -> Redirect | Response[str]:
        """End the session (the form's CSRF token must be the session's)."""
        signed = signed_in(request, engine)
        if signed is not None:
            if not sessions.csrf_matches(signed.csrf_token, data.get("csrf_token")):
                return Response("bad or missing CSRF token", status_code=403)
            sessions.sign_out(engine, request.cookies.get(SESSION_COOKIE))
        return to_signin(request)

    @get("/fleet", sync_to_thread=True)
    def fleet(
        self,
        request: Request[Any, Any, Any],
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
    ) -> Template | Redirect | Response[str]:
        """The group's computers (a page that refreshes its figures from `/fleet/live`)."""
        return _fleet(request, engine, settings, fragment=False)

    @get("/fleet/live", sync_to_thread=True)
    def fleet_live(
        self,
        request: Request[Any, Any, Any],
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
    ) -> Template | Redirect | Response[str]:
        """The part of the fleet page that refreshes (401 without a session): one render
        per group per `REFRESH_MS` shared by its viewers, with an `ETag` (304 to an
        `If-None-Match` that names it)."""
        return _fleet(request, engine, settings, fragment=True)

    @get("/computers/{computer_id:str}", sync_to_thread=True)
    def computer(
        self,
        request: Request[Any, Any, Any],
        computer_id: FromPath[str],
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
    ) -> Template | Redirect:
        """One computer: now, its flags, and charts over the retained history."""
        return _computer(request, computer_id, engine, settings, fragment=False)

    @get("/computers/{computer_id:str}/live", sync_to_thread=True)
    def computer_live(
        self,
        request: Request[Any, Any, Any],
        computer_id: FromPath[str],
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
    ) -> Template | Redirect:
        """The part of a computer's page that refreshes (401 without a session)."""
        return _computer(request, computer_id, engine, settings, fragment=True)

    @get("/computers/{computer_id:str}/history.json", sync_to_thread=True)
    def history(
        self,
        request: Request[Any, Any, Any],
        computer_id: FromPath[str],
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
    ) -> HistoryView:
        """The computer's downsampled history for the charts (401 without a session)."""
        signed = signed_in(request, engine)
        if signed is None:
            raise NotAuthorizedException("signed out")
        try:
            return fleet_service.history(engine, settings, signed.scope, computer_id)
        except fleet_service.ComputerNotFound as exc:
            raise NotFoundException("no such computer") from exc
