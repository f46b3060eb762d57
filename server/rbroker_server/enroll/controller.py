"""`POST /api/v1/enroll`."""

from __future__ import annotations

import json
import logging
from typing import Any

from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.exceptions import ClientException, NotAuthorizedException, TooManyRequestsException
from litestar.params import JSONBody
from sqlalchemy.engine import Engine

from rbroker_protocol.enroll import EnrollRequest, EnrollResponse
from rbroker_server.api.docs import errors
from rbroker_server.edge.bodies import json_body
from rbroker_server.edge.net import client_address
from rbroker_server.edge.ratelimit import Throttles
from rbroker_server.enroll import service

log = logging.getLogger(__name__)


WANT = "send a JSON object with code, name and public_key"


async def enroll_guard(request: Request[Any, Any, Any]) -> None:
    """Before the body is decoded: the address's failed-enrollment limit (429), then the
    JSON body checks (415, 400), then that the body is a JSON object (400 in words: an
    empty body or another JSON value would be answered with the names of internal keys
    and classes)."""
    throttle = Throttles.of(request).enroll
    retry_after = throttle.quick_refusal_s(client_address(request))  # memory: async code
    if retry_after:
        raise TooManyRequestsException(
            f"too many {throttle.what} from your address; try again in {retry_after} s",
            headers={"Retry-After": str(retry_after)},
        )
    body = await json_body(request)
    if not body.strip():
        raise ClientException(f"the request body is empty: {WANT}")
    try:
        value = json.loads(body)
    except ValueError:
        return  # Litestar's decoder says where the JSON is malformed
    if not isinstance(value, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
        got = kind.get(type(value), "a number")
        raise ClientException(f"the request body is {got}: {WANT}")


class EnrollController(Controller):
    path = "/api/v1/enroll"
    tags = ("enrollment",)

    @post(
        "/",
        status_code=201,
        sync_to_thread=True,
        before_request=enroll_guard,
        responses=errors(400, 401, 409, 413, 415, 429, 503),
    )
    def enroll(
        self,
        request: Request[Any, Any, Any],
        data: JSONBody[EnrollRequest],
        engine: NamedDependency[Engine],
    ) -> EnrollResponse:
        """Enroll a computer with a one-time code and its Ed25519 public key.

        400: malformed or nested too deeply. 401: the code is unknown, used or expired.
        409: the key is already enrolled. 415: not `application/json`. 429 with Retry-After:
        too many failed enrollments from this address (`ratelimit.ENROLL_FAILURES` a minute).
        """
        Throttles.of(request).enroll.check(client_address(request))  # shared by all processes
        try:
            response = service.enroll(engine, data)
        except service.EnrollRefused as exc:
            address = client_address(request)
            Throttles.of(request).enroll.spend(address)
            log.warning("enrollment refused (bad code) from %s", address)
            raise NotAuthorizedException(
                "enrollment code invalid, used or expired",
                headers={"WWW-Authenticate": 'Rbroker-Enrollment-Code realm="rbroker"'},
            ) from exc
        except service.EnrollConflict as exc:
            raise ClientException("this public key is already enrolled", status_code=409) from exc
        except service.EnrollInvalid as exc:
            raise ClientException(str(exc), status_code=400) from exc
        log.info("computer %s enrolled from %s", response.computer_id, client_address(request))
        return response
