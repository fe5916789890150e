"""The API's error shape: every error `dbert serve` answers, from a route or from a connection
(a malformed request, one past --max-connections), is OpenAI's {"error": {"message", "type",
"param", "code"}} with its HTTP status."""

from __future__ import annotations

from starlette.responses import JSONResponse


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None, close: bool = False):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code
        self.close = close  # the request's body was not read to its end: the connection is closed after

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers={"Connection": "close"} if self.close else None)
