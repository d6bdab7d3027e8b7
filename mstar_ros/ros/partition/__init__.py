"""A graph, or one partition of it, as a ROS node: streams and outputs as topics.

Only ``partition_node`` imports rclpy at its top: import it where ROS runs.
"""
