"""What a world-model node does between ROS messages and the runtime, without ROS: frames picked
at the model's rate, poses turned into states, plans turned into targets."""
