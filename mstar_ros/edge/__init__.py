"""One edge box: every front-end (pi0.5 robots, the voice gateway, BAGEL images) from one config file.

mstar_ros.edge.config reads ``config/edge.yaml`` (which front-ends run, grouped into processes, the
intra-op threads of each); mstar_ros.edge.host runs one process group's front-ends in one process;
mstar_ros.edge.launch_spec turns the file into the processes ``mstar-ros launch edge`` and
``ros2 launch mstar_ros edge.launch.py`` start.
"""
