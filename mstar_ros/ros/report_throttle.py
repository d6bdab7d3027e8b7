"""ReportThrottle moved to the runtime (``mstar.report_throttle``): the Conductor throttles its own logs
with it. The ROS nodes' import of this name stays valid."""
from mstar.report_throttle import ReportThrottle

__all__ = ["ReportThrottle"]
