"""The Conductor and the request API."""
from mstar.conductor.conductor import Conductor
from mstar.conductor.request import Request, RequestCancelled, RequestError, RequestOutput, RequestStream, UnknownRequest
from mstar.conductor.state import RequestState
from mstar.conductor.worker_status import WorkerSetupError, WorkerStatus

__all__ = ["Conductor", "Request", "RequestCancelled", "RequestError", "RequestOutput", "RequestState",
           "RequestStream", "UnknownRequest", "WorkerSetupError", "WorkerStatus"]
