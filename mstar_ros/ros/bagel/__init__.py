"""BAGEL's ROS side: a node (one per robot namespace) that answers questions about the camera's latest
frame and publishes an edited frame as a goal image, its parameters and its node set.

Only the node's modules (``bagel_node`` and its parts) import rclpy at their top: import them where ROS runs;
``params`` and ``frame_checks`` do not.
"""
