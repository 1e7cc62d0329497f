"""A person opening the Checkpoints page without a login goes to Airflow's login and back.

Airflow's security dependency answers an anonymous request with 401 ``{"detail": "Not
authenticated"}``: right for the JSON API (a client), wrong for a person who followed the
link ``make demo`` prints. ``install`` adds the app's handler of HTTP errors: a 401 for a
GET of a page (any path outside ``/api/``) becomes a redirect to the auth manager's login
URL, as the auth manager names it (``get_url_login(next_url=...)``: the simple auth
manager's ``/auth/login?next=...``, FAB's own page), with the page's path and query as the
way back; every other error keeps FastAPI's JSON answer. Airflow's login checks that the
way back is on this server before it redirects there.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import RedirectResponse, Response
from starlette.exceptions import HTTPException

__all__ = ["install", "is_page", "login_redirect"]

API_PREFIX = "/api/"


def _route_path(request: Request) -> str:
    """The request's path inside the app (without Airflow's prefix and the app's mount)."""
    path, root = request.url.path, request.scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


def is_page(request: Request) -> bool:
    """A GET of something a person opens: not the JSON API (``/api/...``)."""
    return request.method == "GET" and not _route_path(request).startswith(API_PREFIX)


def login_redirect(request: Request) -> RedirectResponse:
    """To the login of Airflow's auth manager, with ``request``'s page as the way back."""
    from airflow.api_fastapi.app import get_auth_manager

    back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(get_auth_manager().get_url_login(next_url=back))


def install(app: FastAPI) -> None:
    """Send a page's 401 to the login; leave every other HTTP error as FastAPI answers it."""

    async def login_or_json(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 401 and is_page(request):
            return login_redirect(request)
        return await http_exception_handler(request, exc)

    app.add_exception_handler(HTTPException, login_or_json)
