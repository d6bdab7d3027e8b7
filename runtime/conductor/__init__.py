"""The Conductor and the request API."""
from mstar.conductor.conductor import Conductor
from mstar.conductor.request import Request, RequestCancelled, RequestError, RequestOutput, RequestStream, UnknownRequest
from mstar.conductor.state import RequestState

__all__ = ["Conductor", "Request", "RequestCancelled", "RequestError", "RequestOutput", "RequestState",
           "RequestStream", "UnknownRequest"]
