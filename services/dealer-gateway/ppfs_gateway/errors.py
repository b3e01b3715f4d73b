"""The gateway's errors, and their one mapping to RFC 9457 problem details.

Every gateway error derives from :class:`ppfs.errors.PpfsError` and carries an HTTP
status and a short title. Messages are safe to show: they name a dataset, a job,
a party or a parameter, never a share, a key, a token or engine output.
"""

from __future__ import annotations

from ppfs.errors import InputDataError, ParameterError, PpfsError, ShareFormatError


class GatewayError(PpfsError):
    status = 500
    title = "Internal server error"
    type_slug = "internal"


class Unauthenticated(GatewayError):
    status = 401
    title = "Missing or invalid bearer token"
    type_slug = "unauthenticated"


class Forbidden(GatewayError):
    status = 403
    title = "Not allowed for this role"
    type_slug = "forbidden"


class NotFound(GatewayError):
    status = 404
    title = "Not found"
    type_slug = "not-found"


class Conflict(GatewayError):
    status = 409
    title = "Conflict with the current state"
    type_slug = "conflict"


class PayloadTooLarge(GatewayError):
    status = 413
    title = "Upload too large"
    type_slug = "too-large"


class InvalidRequest(GatewayError):
    status = 422
    title = "Invalid request"
    type_slug = "invalid"


class MalformedUpload(InvalidRequest):
    title = "Malformed upload"
    type_slug = "malformed-upload"


class IncompatibleSchemas(InvalidRequest):
    title = "Incompatible data set schemas"
    type_slug = "incompatible-schemas"


class PartyUnavailable(GatewayError):
    status = 502
    title = "A computing party did not answer"
    type_slug = "party-unavailable"


class PartyRejected(GatewayError):
    status = 422
    title = "A computing party refused the request"
    type_slug = "party-rejected"


def classify(exc: PpfsError) -> tuple[int, str, str]:
    """(status, title, type slug) for any domain error."""
    if isinstance(exc, GatewayError):
        return exc.status, exc.title, exc.type_slug
    if isinstance(exc, ParameterError):
        return 422, "Invalid parameter", "invalid-parameter"
    if isinstance(exc, InputDataError):
        return 422, "Invalid input data", "invalid-input"
    if isinstance(exc, ShareFormatError):
        return 422, "Malformed upload", "malformed-upload"
    return 500, "Internal server error", "internal"
