"""Errors as OpenAI sends them: `{"error": {"message", "type", "param", "code"}}` with the matching status.

Every failure a handler can meet becomes an `APIError`; `install_error_handlers`
turns it (and FastAPI's validation errors, unknown routes, anything unexpected)
into that JSON. No traceback or internal exception text ever reaches a client:
unexpected exceptions and worker failures are logged here under an error id,
and the client gets a generic message carrying that id.
"""

from __future__ import annotations

import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from router.dispatch import RequestFailedSteps
from router.handoff import HandoffError
from router.registry import NoLiveWorker, WorkerFailed
from router.token_stream import StreamFailed
from router.ttft_prediction import FirstTokenTooLate

logger = logging.getLogger("tandem.router")

_TYPES = {429: "rate_limit_exceeded", 500: "internal_error", 503: "service_unavailable"}  # else invalid_request_error


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        kind = _TYPES.get(self.status, "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def internal_error(what: str, detail: object, status: int = 500, code: str = "internal_error") -> APIError:
    """`what` for the client with an error id; `detail` (an exception or a worker's words) only to the log."""
    error_id = uuid.uuid4().hex[:16]
    exc_info = detail if isinstance(detail, BaseException) else None
    logger.error("%s [error id %s]: %s", what, error_id, detail, exc_info=exc_info)
    return APIError(status, f"{what} (error id {error_id})", code=code)


NO_CAPACITY_RETRY_AFTER_S = 1  # as the 429s' (`RouterConfig.retry_after_s`): KV frees as streams end


def from_dispatch(err: Exception) -> APIError:
    """The HTTP form of what `Dispatcher.start` or a generation raised."""
    if isinstance(err, APIError):
        return err
    if isinstance(err, FirstTokenTooLate):
        return APIError(429, str(err), code="too_many_requests", headers={"Retry-After": str(err.retry_after_s)})
    if isinstance(err, NoLiveWorker):
        return APIError(503, str(err), code="no_live_worker")
    if isinstance(err, HandoffError):  # decode stayed full through the reserve's wait: a client may come back
        if not err.retryable:
            return bad_request(str(err))
        return APIError(503, str(err), code="no_capacity", headers={"Retry-After": str(NO_CAPACITY_RETRY_AFTER_S)})
    if isinstance(err, RequestFailedSteps):  # the request's own fault: its 400, and no worker's
        return APIError(400, str(err), code="request_failed_steps")
    if isinstance(err, (WorkerFailed, StreamFailed)):
        return internal_error("a worker failed during the request", err, 503, "worker_failed")
    if isinstance(err, ValueError):  # a worker refused the request's values (Ray wraps it: keep the cause's words)
        cause = getattr(err, "cause", None)
        return bad_request(str(cause if isinstance(cause, ValueError) else err).strip().splitlines()[-1])
    return internal_error("internal error", err)


def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return bad_request("the request body is not valid JSON").response()
    param = ".".join(loc) or None
    message = f"{param}: {first.get('msg', 'invalid value')}" if param else first.get("msg", "invalid request")
    return bad_request(message, param).response()


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, lambda _, exc: exc.response())
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, lambda _, e: APIError(e.status_code, str(e.detail)).response())
    app.add_exception_handler(Exception, lambda _, exc: from_dispatch(exc).response())
