"""ROS 2 / WebRTC front-ends and the command line."""
