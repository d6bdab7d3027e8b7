"""What every mstar ROS node uses: message conversion, /diagnostics, the ROS process, Worker health.

Nothing here imports rclpy at import time (the modules import it where they use it).
"""
