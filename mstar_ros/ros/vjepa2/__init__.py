"""The V-JEPA 2-AC world model's ROS side: its node (one per robot) and its parameters.

Only the node's modules import rclpy at their top: import them where ROS runs.
"""
