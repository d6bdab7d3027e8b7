"""Robot-side policy logic that knows no ROS: action queues and real-time chunking."""
