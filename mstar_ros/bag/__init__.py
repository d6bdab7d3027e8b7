"""rosbag2 support: a synthetic DROID-like bag generator, bag info, and a player into ROS 2.

- :mod:`mstar_ros.bag.synthetic`: ``write_synthetic_bag`` / ``ensure_synthetic_bag`` /
  ``synthetic_messages`` (rosbags only, no ROS install).
- :mod:`mstar_ros.bag.bundled`: ``bundled_bag`` -- the two-robot synthetic bag the demo and
  the flood benchmark play, made once under the cache.
- :mod:`mstar_ros.bag.info`: ``read_info`` / ``format_info`` (rosbags only).
- :mod:`mstar_ros.bag.player`: ``play`` / ``BagPlayer`` (rclpy, from the ``ros`` extra).
- :mod:`mstar_ros.bag.ros_env`: ``apply_localhost_defaults`` -- call it before any rclpy
  participant is created (localhost-only discovery, the Fast DDS profile).

Nothing here imports rclpy at import time.
"""
