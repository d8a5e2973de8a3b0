"""HTTP calls to API v1, with the API's refusals turned into CliErrors.

Reads retry while the console cannot be reached (a web server restarting, a proxy answering
502-504) for up to `retry_seconds`; a write retries only when its connection was refused
outright, so that it was surely never received and cannot happen twice.
"""

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from trainyard_cli.config import Credentials
from trainyard_cli.errors import (
    BAD_INPUT,
    NOT_FOUND,
    NOT_LOGGED_IN,
    UNAVAILABLE,
    CliError,
    field_messages,
)
from trainyard_cli.states import Vocabulary, from_openapi

API = "/api/v1"
USER_AGENT = "trainyard-cli/1"
RETRY_SECONDS = 60.0
PROXY_UNAVAILABLE = {502, 503, 504}


def _exit_code_for(status: int) -> int:
    if status in (401, 403):
        return NOT_LOGGED_IN
    if status == 404:
        return NOT_FOUND
    if status >= 500:
        return UNAVAILABLE
    return BAD_INPUT


def refusal(response: httpx.Response, rename: Callable[[str], str] = str) -> CliError:
    """The API's answer to a request it did not carry out, as the user should read it (its
    fields named by `rename`)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    lines = field_messages(body, rename)
    status = response.status_code
    if status == 401:
        head = "The console refused the token (revoked, or made on another console)."
        lines.append("Make a new one on your API tokens page and run `trainyard login URL`.")
        return CliError(head, NOT_LOGGED_IN, lines)
    if not lines:
        lines = [response.text.strip()[:300] or response.reason_phrase]
    if status >= 500:
        return CliError(f"The console failed ({status}).", UNAVAILABLE, lines)
    if len(lines) == 1:
        return CliError(lines[0], _exit_code_for(status))
    return CliError("The console refused the request:", _exit_code_for(status), lines)


class Api:
    def __init__(self, credentials: Credentials, retry_seconds: float = RETRY_SECONDS) -> None:
        self.url = credentials.url
        self.token = credentials.token
        self.retry_seconds = retry_seconds
        self.http = httpx.Client(
            base_url=credentials.url + API,
            headers={"Authorization": f"Token {credentials.token}", "User-Agent": USER_AGENT},
            timeout=httpx.Timeout(30.0, connect=10.0),
        )

    def page_url(self, path: str) -> str:
        """A page of the console for the user's browser, e.g. /jobs/42/."""
        return self.url + path

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        deadline = time.monotonic() + self.retry_seconds
        pause = 0.25
        while True:
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.ConnectError as exc:  # refused or unreachable: nothing was sent
                problem: str = str(exc) or type(exc).__name__
            except httpx.TransportError as exc:
                if method != "GET":  # the console may have acted on it: never send twice
                    raise CliError(
                        f"The connection to {self.url} broke during the request ({exc}); "
                        "check whether it took effect before trying again.",
                        UNAVAILABLE,
                    ) from None
                problem = str(exc) or type(exc).__name__
            else:
                if not (method == "GET" and response.status_code in PROXY_UNAVAILABLE):
                    return response
                problem = f"{response.status_code} {response.reason_phrase}"
            if time.monotonic() + pause > deadline:
                raise CliError(f"Cannot reach the console at {self.url}: {problem}", UNAVAILABLE)
            time.sleep(pause)
            pause = min(pause * 2, 5.0)

    def call(
        self, method: str, path: str, rename: Callable[[str], str] = str, **kwargs: Any
    ) -> Any:
        """The answer's JSON; a refusal names its fields by `rename` (e.g. as a job file does)."""
        response = self._send(method, path, **kwargs)
        if response.status_code >= 400:
            raise refusal(response, rename)
        try:
            return response.json()
        except ValueError:
            raise CliError(
                f"{self.url} answered {path} with something that is not JSON; is it a Trainyard "
                "console?",
                UNAVAILABLE,
            ) from None

    @functools.cached_property
    def states(self) -> Vocabulary:
        """The job and instance states the console declares (read once per command)."""
        return from_openapi(self.get("/openapi.json"))

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, rename: Callable[[str], str] = str, **kwargs: Any) -> Any:
        return self.call("POST", path, rename, **kwargs)

    def patch(self, path: str, **kwargs: Any) -> Any:
        return self.call("PATCH", path, **kwargs)

    def delete(self, path: str) -> None:
        response = self._send("DELETE", path)
        if response.status_code >= 400:
            raise refusal(response)

    def stream_text(self, path: str) -> Iterator[str]:
        """A download (logs.txt, metrics.csv), chunk by chunk as the console sends it."""
        try:
            with self.http.stream("GET", path) as response:
                if response.status_code >= 400:
                    response.read()
                    raise refusal(response)
                yield from response.iter_text()
        except httpx.TransportError as exc:
            raise CliError(f"The download from {self.url} broke: {exc}", UNAVAILABLE) from None

    def close(self) -> None:
        self.http.close()
