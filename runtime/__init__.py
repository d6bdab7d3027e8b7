"""mstar: the Walk Graph serving runtime (no models, no ROS)."""
