"""The Conductor and the request API."""

from mstar.conductor.conductor import Conductor
from mstar.conductor.worker_status import WorkerSetupError, WorkerStatus
from mstar.request import Request, RequestCancelled, RequestError, RequestOutput, RequestStream, UnknownRequest

__all__ = [
    "Conductor",
    "Request",
    "RequestCancelled",
    "RequestError",
    "RequestOutput",
    "RequestStream",
    "UnknownRequest",
    "WorkerSetupError",
    "WorkerStatus",
]
