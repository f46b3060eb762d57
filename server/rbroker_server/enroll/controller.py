"""`POST /api/v1/enroll`."""

from __future__ import annotations

from litestar import Controller, post
from litestar.di import NamedDependency
from litestar.exceptions import ClientException, NotAuthorizedException
from litestar.params import JSONBody
from sqlalchemy.engine import Engine

from rbroker_server.enroll import service
from rbroker_server.enroll.schema import EnrollRequest, EnrollResponse


class EnrollController(Controller):
    path = "/api/v1/enroll"
    tags = ("enrollment",)

    @post("/", status_code=201, sync_to_thread=True)
    def enroll(
        self, data: JSONBody[EnrollRequest], engine: NamedDependency[Engine]
    ) -> EnrollResponse:
        """Enroll a computer with a one-time code and its Ed25519 public key.

        401: the code is unknown, used or expired. 409: the key is already enrolled.
        """
        try:
            return service.enroll(engine, data)
        except service.EnrollRefused as exc:
            raise NotAuthorizedException("enrollment code invalid, used or expired") from exc
        except service.EnrollConflict as exc:
            raise ClientException("this public key is already enrolled", status_code=409) from exc
        except service.EnrollInvalid as exc:
            raise ClientException(str(exc), status_code=400) from exc
