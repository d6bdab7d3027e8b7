"""Model graphs (no ROS): each model is its graph, its submodules and its state machine."""
