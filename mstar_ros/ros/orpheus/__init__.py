"""Orpheus TTS's ROS side: the talker's request defaults as ROS parameters, and its text requests.

The nodes themselves are partition nodes (mstar_ros.ros.partition); the process that runs them
is mstar_ros.ros.orpheus.node_set. Nothing here imports rclpy at import time.
"""
